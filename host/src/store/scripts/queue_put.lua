-- queue_put: creates or changes a queue (PUT /queues/{name}). Its token bucket starts
-- full; a change keeps the tokens it has (capped by the new bucket_size at the next use).
-- KEYS: 1 queue, 2 queues index
-- ARGV: 1 prefix, 2 name, 3 now_rfc, 4.. field/value pairs
-- Returns 'created' | 'updated'
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
local created = redis.call('EXISTS', KEYS[1]) == 0
if created then
  redis.call('HSET', KEYS[1], 'state', 'running', 'created_at', ARGV[3])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], 0, ARGV[2])
if created then return 'created' end
return 'updated'

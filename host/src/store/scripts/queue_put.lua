-- queue_put: creates or changes a queue (PUT /queues/{name}). Its token bucket starts
-- full; a change keeps the tokens it has (capped by the new bucket_size at the next use).
-- Waiting tasks are not woken here: the supervisor's queue_wake gives a raised limit's
-- new slots to them within seconds.
-- KEYS: 1 queue, 2 queues index
-- ARGV: 1 prefix, 2 name, 3 now_rfc, 4.. field/value pairs
-- A queue's `mode` (push or pull) is set when it is created and never changes: a field
-- `mode` other than the queue's is refused.
-- Returns 'created' | 'updated' | 'mode_fixed'
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
local created = redis.call('EXISTS', KEYS[1]) == 0
if not created then
  local mode = redis.call('HGET', KEYS[1], 'mode') or 'push'
  for i = 4, #ARGV, 2 do
    if ARGV[i] == 'mode' and ARGV[i + 1] ~= mode then return 'mode_fixed' end
  end
end
if created then
  redis.call('HSET', KEYS[1], 'state', 'running', 'created_at', ARGV[3])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], 0, ARGV[2])
if created then return 'created' end
return 'updated'

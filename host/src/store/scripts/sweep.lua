#!lua flags=allow-oom
-- sweep: deletes Lives finished before CUTOFF (their Plans and history are fields of the
-- Life hash) and index entries, and trims the runs stream to the same retention.
-- KEYS: 1 finished, 2 lives, 3 runs
-- ARGV: 1 prefix, 2 cutoff ms, 3 batch
-- Returns the ids of the Lives deleted (their pointers, if any, are in other shards).
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, uuid in ipairs(ids) do
  local lk = life_key(uuid)
  local f = redis.call('HMGET', lk, 'birth_at_ms', 'resource_id', 'state')
  census(f[3], nil)
  if f[1] then redis.call('ZREM', KEYS[2], lives_member(f[1], uuid)) end
  if f[2] then
    redis.call('ZREM', PREFIX .. 'resource:' .. f[2], uuid)
    redis.call('ZREM', order_key(f[2]), uuid .. ':birth', uuid .. ':death')
  end
  redis.call('DEL', lk)
  redis.call('ZREM', KEYS[1], uuid)
end
redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[2])
return ids

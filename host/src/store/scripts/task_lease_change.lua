-- task_lease_change: a worker's answer about a pull task it leased
-- (POST /queues/{q}/tasks/{task}/ack|extend|nack). The lease id must be the task's
-- current one: once a lease ran out and another worker leased the task, the first
-- worker's answers are refused ('lease_lost'). A lease that ran out but was not taken
-- again may still be answered.
-- ack: the task is done: deleted, its name tombstoned.
-- extend: the lease ends LEASE_MS from now.
-- nack: the lease is given back; the task is due again LEASE_MS from now (0: at once),
--   its attempt counted.
-- KEYS: 1 plan, 2 queue tasks index, 3 queue leased index
-- ARGV: 1 prefix, 2 queue, 3 task, 4 mode, 5 lease_id, 6 lease_ms, 7 now_ms, 8 now_rfc,
--       9 tombstone ms
-- Returns {'ok', lease end ms (extend)} | {'missing'} | {'lease_lost'} | {'not_pull'}
local f = redis.call('HMGET', KEYS[1], 'state', 'lease_id', 'pull')
if not f[1] then return {'missing'} end
if f[3] ~= '1' then return {'not_pull'} end
if f[1] ~= 'Leased' or f[2] ~= ARGV[5] then return {'lease_lost'} end
local task, mode = ARGV[3], ARGV[4]
local at = tonumber(ARGV[7]) + tonumber(ARGV[6])
if mode == 'ack' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], task)
  redis.call('ZREM', KEYS[3], task)
  redis.call('SET', PREFIX .. 'tombstone:' .. ARGV[2] .. '/' .. task, ARGV[8], 'PX', ARGV[9])
  return {'ok'}
elseif mode == 'extend' then
  redis.call('HSET', KEYS[1], 'lease_expires_ms', at)
  redis.call('ZADD', KEYS[2], at, task)
  redis.call('ZADD', KEYS[3], at, task)
  return {'ok', tostring(at)}
end
redis.call('HSET', KEYS[1], 'state', 'Standby')
redis.call('HDEL', KEYS[1], 'lease_id', 'lease_expires_ms')
redis.call('ZADD', KEYS[2], at, task)
redis.call('ZREM', KEYS[3], task)
return {'ok'}

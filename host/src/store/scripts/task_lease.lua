-- task_lease: hands up to COUNT due tasks of a pull queue to a worker for LEASE_MS
-- (POST /queues/{q}/lease; GAE pull queues' lease_tasks). A pull task waits in the
-- queue's tasks index scored by when it may be leased: its ETA, or, while leased, the
-- end of its lease, so that a lease that runs out makes the task due again by itself.
-- Each lease counts an attempt and gets a new lease id, which ack, extend and nack must
-- name (task_lease_change). A due task that has been leased more than the retry block's
-- `limit` times (-1: no limit) without an ack goes to the failed list instead. A paused
-- queue leases nothing. At most SCAN due tasks are looked at per call (for a tag).
-- KEYS: 1 queue, 2 queue tasks index, 3 queue leased index, 4 queue failed list
-- ARGV: 1 prefix, 2 queue, 3 now_ms, 4 count, 5 lease_ms, 6 tag ('' = any), 7 nonce,
--       8 now_rfc, 9 scan
-- Returns {'missing'} | {'push'} | {'ok', then per task 7 values: name, payload, tag,
--   attempts, eta_ms, lease_id, lease_expires_ms}
local q = redis.call('HMGET', KEYS[1], 'mode', 'state', 'retry_limit')
if not q[1] and redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
if q[1] ~= 'pull' then return {'push'} end
local out = {'ok'}
if q[2] == 'paused' then return out end
local queue, now_ms = ARGV[2], tonumber(ARGV[3])
local count, lease_ms, tag = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local limit = tonumber(q[3]) or 100
local expires = now_ms + lease_ms
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms, 'LIMIT', 0, tonumber(ARGV[9]))
local leased = 0
for _, name in ipairs(due) do
  if leased >= count then break end
  local pk = plan_key(queue .. '/' .. name .. ':task')
  local f = redis.call('HMGET', pk, 'tag', 'attempts', 'payload', 'fire_at_ms')
  if tag == '' or f[1] == tag then
    local attempts = tonumber(f[2]) or 0
    if limit >= 0 and attempts > limit then
      redis.call('HSET', pk, 'state', 'Failed', 'failed_at_ms', now_ms, 'failed_at', ARGV[8],
        'last_error', 'leased ' .. attempts .. ' times without an ack; the retry limit is ' .. limit)
      redis.call('HDEL', pk, 'lease_id', 'lease_expires_ms')
      redis.call('ZREM', KEYS[2], name)
      redis.call('ZREM', KEYS[3], name)
      redis.call('ZADD', KEYS[4], now_ms, name)
    else
      attempts = attempts + 1
      local lease_id = ARGV[7] .. '.' .. attempts
      redis.call('HSET', pk, 'state', 'Leased', 'attempts', attempts, 'lease_id', lease_id,
        'lease_expires_ms', expires)
      redis.call('ZADD', KEYS[2], expires, name)
      redis.call('ZADD', KEYS[3], expires, name)
      local n = #out
      out[n + 1] = name
      out[n + 2] = f[3] or 'null'
      out[n + 3] = f[1] or ''
      out[n + 4] = tostring(attempts)
      out[n + 5] = f[4] or '0'
      out[n + 6] = lease_id
      out[n + 7] = tostring(expires)
      leased = leased + 1
    end
  end
end
return out

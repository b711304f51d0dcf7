-- reclaim: puts the Plans a host holds back into the due set, at their own fire times,
-- so that another host fires them (a death overdue runs at once; a birth too late is
-- invalidated by start_run). Used by the supervisor for a host whose lease expired, and
-- by a host handing its Plans back on graceful shutdown. Works in batches; the host
-- leaves the hosts set when it holds nothing more.
-- KEYS: 1 hosts, 2 held:{host}, 3 due
-- ARGV: 1 prefix, 2 host, 3 batch, 4 expired-before ms ('' = the host itself asks),
--       5 notify_before_ms
-- Returns {moved, left} (left = -1: the host renewed its lease meanwhile; nothing done)
local host = ARGV[2]
if ARGV[4] ~= '' then
  local deadline = redis.call('ZSCORE', KEYS[1], host)
  if deadline and tonumber(deadline) > tonumber(ARGV[4]) then return {0, -1} end
end
local ids = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[3]) - 1)
local moved = 0
for _, id in ipairs(ids) do
  moved = moved + hand_back(id, host, ARGV[5], nil)
end
if #ids > 0 then redis.call('ZREM', KEYS[2], unpack(ids)) end
local left = redis.call('ZCARD', KEYS[2])
if left == 0 then redis.call('ZREM', KEYS[1], host) end
return {moved, left}

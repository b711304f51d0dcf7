#!lua flags=allow-oom
-- shard_release: puts up to BATCH of the Plans held in the shard back in the due sets, at
-- their own fire times (a death overdue runs at once; a birth too late is invalidated
-- by start_run; a run cut off is recorded as interrupted). Called by a new owner after
-- shard_takeover, for what its predecessor held, and by an owner giving the shard up
-- (SIGTERM, or a rebalance to a host that joined): with RELEASE = '1', once nothing is
-- left the lease is given up too (the generation stays, so it only ever grows).
-- Only the owner (HOST at GEN) may do either.
-- KEYS: 1 owner, 2 held
-- ARGV: 1 prefix, 2 host, 3 gen, 4 batch, 5 notify_before_ms, 6 release ('1' / '0')
-- Returns {moved, left}, or {0, -1} when HOST at GEN no longer owns the shard.
local o = redis.call('HMGET', KEYS[1], 'host', 'gen')
if o[1] ~= ARGV[2] or o[2] ~= ARGV[3] then return {0, -1} end
local ids = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[4]) - 1)
local moved = 0
for _, id in ipairs(ids) do
  if plan_exists(id) then
    moved = moved + hand_back(id, ARGV[5], nil, nil)
  end
end
if #ids > 0 then redis.call('ZREM', KEYS[2], unpack(ids)) end
local left = redis.call('ZCARD', KEYS[2])
if left == 0 and ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'host', '', 'until', 0)
end
return {moved, left}

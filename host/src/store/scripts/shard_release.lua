#!lua flags=allow-oom
-- shard_release: puts up to BATCH of the Plans held in the shard back where they wait, at
-- their own fire times (a death overdue runs at once; a birth too late is invalidated
-- at its start; a run cut off is recorded as interrupted). Called by a new owner after
-- shard_takeover, for what its predecessor held, and by an owner giving the shard up
-- (SIGTERM, or a rebalance to a host that joined): with RELEASE = '1', once nothing is
-- left the lease is given up too (the generation stays, so it only ever grows).
-- Only the owner (HOST at GEN) may do either.
-- A Life's Plan claimed (Preset) goes back to the due tree here. One that was running
-- is answered instead, for the host to record the cut-off run in its Life's record and
-- put it back (life_apply), since the host owns the record's format.
-- KEYS: 1 owner, 2 held, 3 inflight, 4 due (tree)
-- ARGV: 1 prefix, 2 host, 3 gen, 4 batch, 5 notify_before_ms, 6 release ('1' / '0')
-- Returns {moved, left, {plan_id, inflight entry, ...} of runs cut off}, or {0, -1, {}}
--   when HOST at GEN no longer owns the shard.
local o = redis.call('HMGET', KEYS[1], 'host', 'gen')
if o[1] ~= ARGV[2] or o[2] ~= ARGV[3] then return {0, -1, {}} end
local batch = tonumber(ARGV[4])
-- Timers' and queue tasks' Plans, each a hash of its own (hand_back).
local ids = redis.call('ZRANGE', KEYS[2], 0, batch - 1)
local moved = 0
for _, id in ipairs(ids) do
  if plan_exists(id) then
    moved = moved + hand_back(id, ARGV[5], nil, nil)
  end
end
if #ids > 0 then redis.call('ZREM', KEYS[2], unpack(ids)) end
-- Lives' Plans.
local page = redis.call('HSCAN', KEYS[3], 0, 'COUNT', batch)[2]
local back, cut_off = {}, {}
for i = 1, #page, 2 do
  local id, f = page[i], inflight_parse(page[i + 1])
  if f and f.running then
    cut_off[#cut_off + 1] = id
    cut_off[#cut_off + 1] = page[i + 1]
  else
    back[#back + 1] = id
    if f and get_record(string.sub(id, 1, -7)) then
      tree_add(KEYS[4], f.fire_ms, id)
      notify_if_soon(f.fire_ms, ARGV[5])
      moved = moved + 1
    end
  end
end
if #back > 0 then redis.call('HDEL', KEYS[3], unpack(back)) end
local left = redis.call('ZCARD', KEYS[2]) + redis.call('HLEN', KEYS[3])
if left == 0 and ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'host', '', 'until', 0)
end
return {moved, left, cut_off}

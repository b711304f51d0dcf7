#!lua flags=allow-oom
-- release: the shard's owner hands back named Plans it holds but no longer tracks in
-- memory (a claim or start whose reply was lost, an outcome it could not record). Each
-- Plan is named with the claim the host knows is lost, and moves only under that claim,
-- so a newer claim of the same Plan is never taken away; a stale timer entry of a Plan
-- handed back fails its fence at start_run.
-- KEYS: 1 held
-- ARGV: 1 prefix, 2 host, 3 notify_before_ms, 4 runs started before this ms may move,
--       5.. plan id, claim pairs
-- Returns the number of Plans moved back to the due set.
local moved, done = 0, {}
for i = 5, #ARGV, 2 do
  local pk, pn = plan_of(ARGV[i])
  if redis.call('HEXISTS', pk, pn.state) == 0 then
    -- The Plan is gone (deleted with its queue or timer): only the entry is left.
    done[#done + 1] = ARGV[i]
  elseif redis.call('HGET', pk, pn.lease_owner) == ARGV[2] then
    local r = hand_back(ARGV[i], ARGV[3], ARGV[4], ARGV[i + 1])
    if r == 1 then
      moved = moved + 1
      done[#done + 1] = ARGV[i]
    end
  end
end
if #done > 0 then redis.call('ZREM', KEYS[1], unpack(done)) end
return moved

-- release: a live host hands back named Plans it holds but no longer tracks in memory
-- (a claim or start whose reply was lost, an outcome it could not record). Safe against
-- a stale timer entry of the same Plan: a later start_run fails its fence.
-- KEYS: 1 held:{host}
-- ARGV: 1 prefix, 2 host, 3 notify_before_ms, 4 runs started before this ms may move,
--       5.. plan ids
-- Returns the number of Plans moved back to the due set.
local moved, done = 0, {}
for i = 5, #ARGV do
  local r = hand_back(ARGV[i], ARGV[2], ARGV[3], ARGV[4])
  if r >= 0 then
    moved = moved + r
    done[#done + 1] = ARGV[i]
  end
end
if #done > 0 then redis.call('ZREM', KEYS[1], unpack(done)) end
return moved

#!lua flags=allow-oom
-- release: the shard's owner hands back named Plans it holds but no longer tracks in
-- memory (a claim or start whose reply was lost, an outcome it could not record). Each
-- Plan is named with the claim the host knows is lost, and moves only under that claim,
-- so a newer claim of the same Plan is never taken away; a stale timer entry of a Plan
-- handed back fails its fence at start_run. A Life's Plan that was running is answered
-- instead, for the host to record the cut-off run (as shard_release does).
-- KEYS: 1 held, 2 inflight, 3 due (tree)
-- ARGV: 1 prefix, 2 host, 3 notify_before_ms, 4 runs started before this ms may move,
--       5.. plan id, claim pairs
-- Returns {moved, {plan_id, inflight entry, ...} of Lives' runs cut off}.
local moved, done, back, cut_off = 0, {}, {}, {}
for i = 5, #ARGV, 2 do
  local id, claim = ARGV[i], ARGV[i + 1]
  local tail = string.sub(id, -6)
  if tail == ':birth' or tail == ':death' then
    local v = redis.call('HGET', KEYS[2], id)
    local f = inflight_parse(v)
    if f and f.claim == claim and f.host == ARGV[2] then
      if f.running then
        if f.started_ms < tonumber(ARGV[4]) then
          cut_off[#cut_off + 1] = id
          cut_off[#cut_off + 1] = v
        end
      else
        back[#back + 1] = id
        if get_record(string.sub(id, 1, -7)) then
          tree_add(KEYS[3], f.fire_ms, id)
          notify_if_soon(f.fire_ms, ARGV[3])
          moved = moved + 1
        end
      end
    end
  else
    local pk, pn = plan_of(id)
    if redis.call('HEXISTS', pk, pn.state) == 0 then
      -- The Plan is gone (deleted with its queue or timer): only the entry is left.
      done[#done + 1] = id
    elseif redis.call('HGET', pk, pn.lease_owner) == ARGV[2] then
      local r = hand_back(id, ARGV[3], ARGV[4], claim)
      if r == 1 then
        moved = moved + 1
        done[#done + 1] = id
      end
    end
  end
end
if #done > 0 then redis.call('ZREM', KEYS[1], unpack(done)) end
if #back > 0 then redis.call('HDEL', KEYS[2], unpack(back)) end
return {moved, cut_off}

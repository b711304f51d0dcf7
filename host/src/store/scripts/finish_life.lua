#!lua flags=allow-oom
-- finish_life: records a batch of finished runs of Lives' Plans. The host decided what
-- each run leads to (store/record/: a point's birth done -> Dead; a term's -> Alive and
-- its death due; a retry; a failed birth -> Stillbirth; a death failing is retried) and
-- built the Life's new record; this writes it, with the index changes that go with it,
-- only under the run's claim.
-- A record is written in place of the one the Plan was claimed with, unless the Life
-- changed while the run went on (a PATCH of its other Plan, a DELETE asking to cancel:
-- the Life is in `touched`) or EXPECT names the text it replaces: then 'stale', and the
-- host builds it again from the record as it is now.
-- A call retried after its reply was lost finds its own `done_by` mark (`"db"`) in the
-- record and answers 'ok' again without writing anything twice.
-- On a standalone Redis one call carries the runs of many shards, a section each (a
-- shard's calls carried a few runs each, and each call costs Redis more than its runs'
-- share of the work); on a Redis Cluster a call is one shard's.
-- KEYS: 1 the first section's inflight (it names the node to call)
-- ARGV: 1 '' (each section brings its shard's prefix), 2 host, 3 now_ms,
--       4 notify_before_ms, 5 runs stream max length, then per section: the shard's
--       prefix, the count of its runs, and per run 16 values: plan_id, claim, expect
--       ('' = the record as claimed), the new record, census from and to ('' = none), a
--       Plan to enter the due tree and when ('' = none), the Plans that leave the
--       resource's order set (space separated), resource_id, finished ('1': onto the
--       finished list at now; 'F': and a failure, into the `failed` index too),
--       callback Life id, its record and its plugins (space separated), the run's record
--       for the runs stream, its outcome word
-- Returns per run, in the order given: 'ok' | 'stale' | 'lost' (the Plan is not this
--   host's run any more)
local K = 16
local host, now_ms, notify_before = ARGV[2], ARGV[3], ARGV[4]
-- A finished Life's `finished` entry is this and its id.
local finished_at = finished_entry(now_ms, '')
local out = {}

-- The section of N runs whose arguments begin at ARGV[A], in the current shard.
local function finish_section(a, n)
  if n == 0 then return end
  local plans, uuids = {}, {}
  for i = 0, n - 1 do
    local id = ARGV[a + i * K]
    plans[#plans + 1] = id
    uuids[#uuids + 1] = string.sub(id, 1, -7)
  end
  local due, inflight_key = PREFIX .. 'due', PREFIX .. 'inflight'
  local inflight = redis.call('HMGET', inflight_key, unpack(plans))
  local touched = redis.call('SMISMEMBER', PREFIX .. 'touched', unpack(uuids))
  local done, finished, failed = {}, {}, {}
  -- What a run changes besides its record (which is written already), in its shard.
  local function record_run(b, plan_id, uuid, was_touched)
    if was_touched then redis.call('SREM', PREFIX .. 'touched', uuid) end
    done[#done + 1] = plan_id
    local from, to = ARGV[b + 4], ARGV[b + 5]
    if from ~= '' or to ~= '' then census(from ~= '' and from or nil, to ~= '' and to or nil) end
    if ARGV[b + 6] ~= '' then
      tree_add(due, ARGV[b + 7], ARGV[b + 6])
      notify_if_soon(ARGV[b + 7], notify_before)
    end
    if ARGV[b + 8] ~= '' then
      local ids = {}
      for id in string.gmatch(ARGV[b + 8], '%S+') do ids[#ids + 1] = id end
      redis.call('ZREM', order_key(ARGV[b + 9]), unpack(ids))
    end
    local fin = ARGV[b + 10]
    if fin == '1' or fin == 'F' then finished[#finished + 1] = finished_at .. uuid end
    if fin == 'F' then
      failed[#failed + 1] = now_ms
      failed[#failed + 1] = uuid
    end
    if ARGV[b + 11] ~= '' then
      book_callback(ARGV[b + 11], ARGV[b + 12], ARGV[b + 13], now_ms, notify_before)
    end
    if ARGV[b + 14] ~= '' then
      add_run(PREFIX .. 'runs', ARGV[5], 'life', uuid, 'plan', string.sub(plan_id, -5),
        'outcome', ARGV[b + 15], 'record', ARGV[b + 14])
    end
  end
  for i = 0, n - 1 do
    local b = a + i * K
    local plan_id, claim, expect, rec = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
    local uuid, was_touched = uuids[i + 1], touched[i + 1] == 1
    local f_claim, f_host = inflight_owner(inflight[i + 1])
    local key = record_key(uuid)
    local verdict
    -- A Plan still Preset under this claim is a birth start_run found too late ('late'):
    -- its host records it Invalidated here.
    if f_claim ~= claim or f_host ~= host then
      local cur = redis.call('HGET', key, uuid)
      if cur and string.find(cur, '"db":"' .. host .. '#' .. claim .. '"', 1, true) then
        verdict = 'ok'
      else
        verdict = 'lost'
      end
    elseif expect ~= '' or was_touched then
      -- The Life changed while the run went on, or the host built the record against
      -- the one it read after such a change: the record as it is now decides.
      local cur = redis.call('HGET', key, uuid)
      if not cur then
        done[#done + 1] = plan_id
        verdict = 'lost'
      elseif expect == '' or cur ~= expect then
        verdict = 'stale'
      else
        redis.call('HSET', key, uuid, rec)
        record_run(b, plan_id, uuid, was_touched)
        verdict = 'ok'
      end
    elseif redis.call('HSET', key, uuid, rec) == 1 then
      -- Written in place of the record as claimed (nothing changed it: it is not in
      -- `touched`), without reading it first: a field that was not there says the Life
      -- is gone (deleted by hand, or swept after this host lost the Plan). The write is
      -- taken back; its claim goes, nothing comes back.
      redis.call('HDEL', key, uuid)
      done[#done + 1] = plan_id
      verdict = 'lost'
    else
      record_run(b, plan_id, uuid, false)
      verdict = 'ok'
    end
    out[#out + 1] = verdict
  end
  if #done > 0 then redis.call('HDEL', inflight_key, unpack(done)) end
  if #finished > 0 then redis.call('RPUSH', PREFIX .. 'finished', unpack(finished)) end
  if #failed > 0 then redis.call('ZADD', PREFIX .. 'failed', unpack(failed)) end
end

batch_begin()
local a = 6
while a <= #ARGV do
  enter_shard(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  finish_section(a + 2, n)
  a = a + 2 + n * K
end
batch_end()
return out

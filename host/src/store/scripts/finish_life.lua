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
--       prefix, the count of its runs, and per run: plan_id, claim, the new record,
--       its flags, its Life's id_hash (record_bucket.lua: the host works it out, a SHA-1
--       in Lua costing Redis more than the argument), then the groups its flags name.
--       The flags: a first character for the finished list ('1': onto it at now; 'F':
--       and a failure, into the `failed` index too; '0': neither), two for the census
--       change (from and to: CENSUS_CODES, '-' for none), then a letter for each group
--       of arguments that follows, in this order: 'x' the record as claimed was
--       replaced, the text the new one replaces (1); 'q' a Plan to enter the due tree
--       and when (2); 'o' the Plans that leave the resource's order set (space
--       separated) and the resource_id (2); 'c' a callback Life's id, record and plugins
--       (space separated) (3); 's' the run's record for the runs stream and its outcome
--       word (2). A point's birth done is 5 arguments, '1ID' its flags: each argument
--       costs Redis about a quarter of a microsecond, empty or not.
-- Returns per run, in the order given: 'ok' | 'stale' | 'lost' (the Plan is not this
--   host's run any more)
local EXTRA_ARGS = {x = 1, q = 2, o = 2, c = 3, s = 2}
local CENSUS_CODES = {I = 'Inexistent', A = 'Alive', D = 'Dead', S = 'Stillbirth',
  V = 'Invalidated'}
local NO_EXTRAS = {}
local NONE_TOUCHED = {}
-- What each flags string seen in this call says ({fin, from, to}), worked out once: most
-- runs of a call share theirs.
local flag_meaning = {}
local host, now_ms, notify_before = ARGV[2], ARGV[3], ARGV[4]
-- A finished Life's `finished` entry is this and its id.
local finished_at = finished_entry(now_ms, '')
local out = {}

-- Where each of a run's groups of extra arguments begins (by its letter), and where the
-- next run begins: B is where the run's arguments begin.
local function run_extras(b)
  local flags = ARGV[b + 3]
  if #flags == 3 then return NO_EXTRAS, b + 5 end
  local at, p = {}, b + 5
  for k = 4, #flags do
    local c = string.sub(flags, k, k)
    at[c] = p
    p = p + EXTRA_ARGS[c]
  end
  return at, p
end

-- The section of N runs whose arguments begin at ARGV[A], in the current shard: where
-- the next section begins.
local function finish_section(a, n)
  if n == 0 then return a end
  local plans, uuids, starts, extras = {}, {}, {}, {}
  local b = a
  for i = 1, n do
    local id = ARGV[b]
    plans[i] = id
    uuids[i] = string.sub(id, 1, -7)
    starts[i] = b
    extras[i], b = run_extras(b)
  end
  local next_section = b
  local due, inflight_key = PREFIX .. 'due', PREFIX .. 'inflight'
  local inflight = redis.call('HMGET', inflight_key, unpack(plans))
  -- `touched` is empty but for the Lives changed while a Plan of theirs ran: one EXISTS
  -- a section then, rather than every run's uuid sent in and its answer sent back.
  local touched_key = PREFIX .. 'touched'
  local touched = NONE_TOUCHED
  if redis.call('EXISTS', touched_key) == 1 then
    touched = redis.call('SMISMEMBER', touched_key, unpack(uuids))
  end
  local done, finished, failed = {}, {}, {}
  local n_done, n_finished = 0, 0
  -- What a run changes besides its record (which is written already), in its shard.
  local function record_run(b, e, plan_id, uuid, was_touched)
    if was_touched then redis.call('SREM', PREFIX .. 'touched', uuid) end
    n_done = n_done + 1
    done[n_done] = plan_id
    local flags = ARGV[b + 3]
    local f = flag_meaning[flags]
    if not f then
      f = {fin = string.sub(flags, 1, 1), from = CENSUS_CODES[string.sub(flags, 2, 2)],
        to = CENSUS_CODES[string.sub(flags, 3, 3)]}
      flag_meaning[flags] = f
    end
    if f.from or f.to then census(f.from, f.to) end
    if e.q then
      tree_add(due, ARGV[e.q + 1], ARGV[e.q])
      notify_if_soon(ARGV[e.q + 1], notify_before)
    end
    if e.o then
      local ids = {}
      for id in string.gmatch(ARGV[e.o], '%S+') do ids[#ids + 1] = id end
      if #ids > 0 then redis.call('ZREM', order_key(ARGV[e.o + 1]), unpack(ids)) end
    end
    local fin = f.fin
    if fin == '1' or fin == 'F' then
      n_finished = n_finished + 1
      finished[n_finished] = finished_at .. uuid
    end
    if fin == 'F' then
      failed[#failed + 1] = now_ms
      failed[#failed + 1] = uuid
    end
    if e.c then
      book_callback(ARGV[e.c], ARGV[e.c + 1], ARGV[e.c + 2], now_ms, notify_before)
    end
    if e.s then
      add_run(PREFIX .. 'runs', ARGV[5], 'life', uuid, 'plan', string.sub(plan_id, -5),
        'outcome', ARGV[e.s + 1], 'record', ARGV[e.s])
    end
  end
  for i = 1, n do
    local b, e = starts[i], extras[i]
    local plan_id, claim, rec = plans[i], ARGV[b + 1], ARGV[b + 2]
    local expect = e.x and ARGV[e.x] or ''
    local uuid, was_touched = uuids[i], touched[i] == 1
    local key = record_key_hashed(uuid, tonumber(ARGV[b + 4]))
    local verdict
    -- A Plan still Preset under this claim is a birth start_run found too late ('late'):
    -- its host records it Invalidated here.
    if not inflight_holds(inflight[i], claim, host) then
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
        n_done = n_done + 1
        done[n_done] = plan_id
        verdict = 'lost'
      elseif expect == '' or cur ~= expect then
        verdict = 'stale'
      else
        redis.call('HSET', key, uuid, rec)
        record_run(b, e, plan_id, uuid, was_touched)
        verdict = 'ok'
      end
    elseif redis.call('HSET', key, uuid, rec) == 1 then
      -- Written in place of the record as claimed (nothing changed it: it is not in
      -- `touched`), without reading it first: a field that was not there says the Life
      -- is gone (deleted by hand, or swept after this host lost the Plan). The write is
      -- taken back; its claim goes, nothing comes back.
      redis.call('HDEL', key, uuid)
      n_done = n_done + 1
      done[n_done] = plan_id
      verdict = 'lost'
    else
      record_run(b, e, plan_id, uuid, false)
      verdict = 'ok'
    end
    out[#out + 1] = verdict
  end
  if n_done > 0 then redis.call('HDEL', inflight_key, unpack(done)) end
  if n_finished > 0 then redis.call('RPUSH', PREFIX .. 'finished', unpack(finished)) end
  if #failed > 0 then redis.call('ZADD', PREFIX .. 'failed', unpack(failed)) end
  return next_section
end

batch_begin()
local a = 6
while a <= #ARGV do
  enter_shard(ARGV[a])
  a = finish_section(a + 2, tonumber(ARGV[a + 1]))
end
batch_end()
return out

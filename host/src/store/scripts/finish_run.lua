#!lua flags=allow-oom
-- finish_run: for a batch of finished runs, records each run and moves the state
-- machines on.
-- outcome 'done': birth of a point -> Dead; birth of a term -> Alive and the death Plan
--   joins the due set (at once if a cancel came in meanwhile, or if its time passed);
--   death -> Dead.
-- outcome 'retry': the Plan goes back to Standby at NEXT_MS.
-- outcome 'failed' (birth only; a death is always retried): Stillbirth.
-- A Plan that ends for good leaves its resource's order set, letting the next Plan of the
-- resource start.
-- A run is recorded as field `run:{plan}:{attempt}` of its Life (the Life's history, kept
-- with the Life, the last RUNS_KEPT per Plan) and, when the operator keeps one, in the
-- capped stream `runs` (every run of every Life, for tailing).
-- A host that lost its claim meanwhile still records the run but changes no state.
-- A call retried after its reply was lost finds its own `done_by` mark on the Plan and
-- answers 'ok' again without writing anything twice.
-- KEYS: 1 held, 2 due, 3 runs
-- ARGV: 1 prefix, 2 host, 3 now_ms, 4 notify_before_ms, 5 runs stream max
--       length, then per run 11 values: plan_id, claim, outcome, next_ms,
--       status ('' = none), error ('' = none), attempt, history outcome word, record JSON,
--       callback Life id and action ('' = none: see book_callback), booked with the
--       outcome it reports
-- Returns per run: 'ok' | 'lost'
local RUNS_KEPT = 50
local host, now_ms, notify_before = ARGV[2], ARGV[3], ARGV[4]
local out, done_ids = {}, {}
batch_begin()

-- A Life's Plans are fields of its hash (plan_of), so each run reads the Plan's and the
-- Life's fields in one HMGET and writes them in one HSET: the Plan's outcome, the run
-- record, and the Life's new state together.
local function apply(plan_id, claim, outcome, next_ms, status, err, attempt, word, record,
    callback, callback_action)
  local uuid, kind = string.sub(plan_id, 1, -7), string.sub(plan_id, -5)
  local lk, pn = plan_of(plan_id)
  local f = redis.call('HMGET', lk, pn.state, pn.lease_owner, pn.claims, 'resource_id', pn.term,
    pn.last_error, pn.done_by, 'state', 'cancel_requested', 'd.fire_at_ms')
  if f[7] == host .. '#' .. claim then
    -- Applied by the first call. The held entry went then; if it is there now, it is a
    -- newer claim of the same Plan and stays.
    return 'ok'
  end
  local run_field = 'run:' .. kind .. ':' .. attempt
  local function add_history()
    add_run(KEYS[3], ARGV[5], 'life', uuid, 'plan', kind, 'outcome', word, 'record', record)
    if attempt > RUNS_KEPT then redis.call('HDEL', lk, 'run:' .. kind .. ':' .. (attempt - RUNS_KEPT)) end
  end
  if f[1] ~= 'Running' or f[2] ~= host or f[3] ~= claim then
    -- Taken over meanwhile: record the run if the Life is still there (a swept Life
    -- must not come back as a bare hash), leave everything else to the new holder,
    -- including this host's held entry if it claimed the Plan again.
    if f[8] then
      add_history()
      redis.call('HSET', lk, run_field, record)
    end
    return 'lost'
  end
  -- Running under this claim, so its Life is there: only finished Lives are swept, and
  -- a Life whose Plan runs is not finished.
  add_history()
  done_ids[#done_ids + 1] = plan_id
  -- What this run writes into the Life's hash: the run record, the Plan's outcome, and
  -- the Life's own changes, added below. lease_owner stays as the last host that held
  -- the Plan; it only means "holds it now" while the state is Preset or Running.
  local w = {run_field, record, pn.done_by, host .. '#' .. claim}
  local function put(name, value)
    w[#w + 1] = name
    w[#w + 1] = value
  end
  if status ~= '' then put(pn.last_status, status) end
  if err ~= '' then
    put(pn.last_error, err)
  elseif f[6] then
    redis.call('HDEL', lk, pn.last_error)
  end
  local life_state = f[8]
  -- The Life ends as TO: counted, listed in `finished` (finish_life in common.lua).
  local function finish(to)
    census(life_state, to)
    put('state', to)
    put('finished_at_ms', now_ms)
    put('updated_at_ms', now_ms)
    finished_batch[#finished_batch + 1] = now_ms
    finished_batch[#finished_batch + 1] = uuid
  end
  if outcome == 'retry' and kind == 'birth' and f[9] == '1' then
    -- Cancelled while this birth ran and it did not succeed: never start it again.
    put(pn.state, 'Cancelled')
    leave_order(plan_id, f[4])
    if f[5] == '1' then cancel_plan(uuid .. ':death') end
    finish('Stillbirth')
  elseif outcome == 'retry' then
    put(pn.state, 'Standby')
    put(pn.fire_at_ms, next_ms)
    put('updated_at_ms', now_ms)
    redis.call('ZADD', KEYS[2], next_ms, plan_id)
    notify_if_soon(next_ms, notify_before)
  elseif outcome == 'done' then
    put(pn.state, 'Done')
    leave_order(plan_id, f[4])
    if kind == 'birth' and f[5] == '1' then
      -- A term's birth: the Life is Alive and its death Plan becomes due (at once if a
      -- cancel came in meanwhile).
      local death_ms = f[10]
      if f[9] == '1' then
        death_ms = now_ms
        put('d.fire_at_ms', now_ms)
      end
      census(life_state, 'Alive')
      put('state', 'Alive')
      put('updated_at_ms', now_ms)
      redis.call('ZADD', KEYS[2], death_ms, uuid .. ':death')
      notify_if_soon(death_ms, notify_before)
    else
      finish('Dead')
    end
  else
    put(pn.state, 'Failed')
    leave_order(plan_id, f[4])
    if kind == 'birth' then
      if f[5] == '1' then cancel_plan(uuid .. ':death') end
      finish('Stillbirth')
    else
      finish('Dead')
    end
  end
  redis.call('HSET', lk, unpack(w))
  if outcome ~= 'retry' then
    book_callback(callback, callback_action, plan_id, now_ms, notify_before)
  end
  return 'ok'
end

for i = 6, #ARGV, 11 do
  out[#out + 1] = apply(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
    ARGV[i + 5], tonumber(ARGV[i + 6]), ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10])
end
if #done_ids > 0 then redis.call('ZREM', KEYS[1], unpack(done_ids)) end
batch_end()
return out

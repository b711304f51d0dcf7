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

local function apply(plan_id, claim, outcome, next_ms, status, err, attempt, word, record,
    callback, callback_action)
  local uuid, kind = string.match(plan_id, '^(.*):(%a+)$')
  local lk = life_key(uuid)
  local pk = plan_key(plan_id)
  local f = redis.call('HMGET', pk, 'state', 'lease_owner', 'claims', 'resource_id', 'term',
    'last_error', 'done_by')
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
    if redis.call('EXISTS', lk) == 1 then
      add_history()
      redis.call('HSET', lk, run_field, record)
    end
    return 'lost'
  end
  -- Running under this claim, so its Life is there: only finished Lives are swept, and
  -- a Life whose Plan runs is not finished.
  add_history()
  done_ids[#done_ids + 1] = plan_id
  -- lease_owner stays as the last host that held the Plan; it only means "holds it now"
  -- while the state is Preset or Running.
  local plan_fields = {'done_by', host .. '#' .. claim}
  if status ~= '' then plan_fields[#plan_fields + 1] = 'last_status'; plan_fields[#plan_fields + 1] = status end
  if err ~= '' then
    plan_fields[#plan_fields + 1] = 'last_error'; plan_fields[#plan_fields + 1] = err
  elseif f[6] then
    redis.call('HDEL', pk, 'last_error')
  end
  if outcome == 'retry' and kind == 'birth' and redis.call('HGET', lk, 'cancel_requested') == '1' then
    -- Cancelled while this birth ran and it did not succeed: never start it again.
    redis.call('HSET', pk, 'state', 'Cancelled', unpack(plan_fields))
    leave_order(pk, plan_id, f[4])
    if f[5] == '1' then cancel_plan(uuid .. ':death') end
    finish_life(lk, uuid, 'Stillbirth', now_ms, run_field, record)
  elseif outcome == 'retry' then
    redis.call('HSET', pk, 'state', 'Standby', 'fire_at_ms', next_ms, unpack(plan_fields))
    redis.call('ZADD', KEYS[2], next_ms, plan_id)
    redis.call('HSET', lk, 'updated_at_ms', now_ms, run_field, record)
    notify_if_soon(next_ms, notify_before)
  elseif outcome == 'done' then
    redis.call('HSET', pk, 'state', 'Done', unpack(plan_fields))
    leave_order(pk, plan_id, f[4])
    if kind == 'birth' and f[5] == '1' then
      -- A term's birth: the Life is Alive and its death Plan becomes due.
      local dk = plan_key(uuid .. ':death')
      local death_ms = redis.call('HGET', dk, 'fire_at_ms')
      if redis.call('HGET', lk, 'cancel_requested') == '1' then
        death_ms = now_ms
        redis.call('HSET', dk, 'fire_at_ms', now_ms)
      end
      census(redis.call('HGET', lk, 'state'), 'Alive')
      redis.call('HSET', lk, 'state', 'Alive', 'updated_at_ms', now_ms, run_field, record)
      redis.call('ZADD', KEYS[2], death_ms, uuid .. ':death')
      notify_if_soon(death_ms, notify_before)
    else
      finish_life(lk, uuid, 'Dead', now_ms, run_field, record)
    end
  else
    redis.call('HSET', pk, 'state', 'Failed', unpack(plan_fields))
    leave_order(pk, plan_id, f[4])
    if kind == 'birth' then
      if f[5] == '1' then cancel_plan(uuid .. ':death') end
      finish_life(lk, uuid, 'Stillbirth', now_ms, run_field, record)
    else
      finish_life(lk, uuid, 'Dead', now_ms, run_field, record)
    end
  end
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

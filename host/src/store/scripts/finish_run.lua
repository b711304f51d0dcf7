-- finish_run: for a batch of finished runs, records each run and moves the state
-- machines on.
-- outcome 'done': birth of a point -> Dead; birth of a term -> Alive and the death Plan
--   joins the due set (at once if a cancel came in meanwhile, or if its time passed);
--   death -> Dead.
-- outcome 'retry': the Plan goes back to Standby at NEXT_MS.
-- outcome 'failed' (birth only; a death is always retried): Stillbirth.
-- A run is recorded twice: as field `run:{plan}:{attempt}` of its Life (the Life's
-- history, kept with the Life, the last RUNS_KEPT per Plan) and as an entry of the
-- capped stream `runs` (every run of every Life, for operators to tail).
-- A host that lost its claim meanwhile still records the run but changes no state.
-- KEYS: 1 held:{host}, 2 due, 3 runs
-- ARGV: 1 prefix, 2 host, 3 now_ms, 4 now_rfc, 5 notify_before_ms, 6 runs stream max
--       length, then per run 10 values: plan_id, claim, outcome, next_ms, next_rfc,
--       status ('' = none), error ('' = none), attempt, history outcome word, record JSON
-- Returns per run: 'ok' | 'lost'
local RUNS_KEPT = 50
local host, now_ms, now_rfc, notify_before = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local out, done_ids = {}, {}
for i = 7, #ARGV, 10 do
  local plan_id, claim, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local next_ms, next_rfc, status, err = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local attempt, word, record = tonumber(ARGV[i + 7]), ARGV[i + 8], ARGV[i + 9]
  local uuid, kind = string.match(plan_id, '^(.*):(%a+)$')
  local lk = life_key(uuid)
  local run_field = 'run:' .. kind .. ':' .. attempt
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'life', uuid, 'plan', kind,
    'outcome', word, 'record', record)
  if attempt > RUNS_KEPT then redis.call('HDEL', lk, 'run:' .. kind .. ':' .. (attempt - RUNS_KEPT)) end

  local pk = plan_key(plan_id)
  local f = redis.call('HMGET', pk, 'state', 'lease_owner', 'claims', 'resource_id', 'term', 'last_error')
  if f[4] then
    local lock = PREFIX .. 'lock:' .. f[4]
    if redis.call('GET', lock) == plan_id .. '#' .. claim then redis.call('DEL', lock) end
  end
  if f[1] ~= 'Running' or f[2] ~= host or f[3] ~= claim then
    -- Taken over meanwhile: record the run if the Life is still there (a swept Life
    -- must not come back as a bare hash), leave everything else to the new holder,
    -- including this host's held entry if it claimed the Plan again.
    if redis.call('EXISTS', lk) == 1 then redis.call('HSET', lk, run_field, record) end
    out[#out + 1] = 'lost'
  else
    done_ids[#done_ids + 1] = plan_id
    -- lease_owner stays as the last host that held the Plan; it only means "holds it
    -- now" while the state is Preset or Running.
    local plan_fields = {}
    if status ~= '' then plan_fields[#plan_fields + 1] = 'last_status'; plan_fields[#plan_fields + 1] = status end
    if err ~= '' then
      plan_fields[#plan_fields + 1] = 'last_error'; plan_fields[#plan_fields + 1] = err
    elseif f[6] then
      redis.call('HDEL', pk, 'last_error')
    end
    if outcome == 'retry' and kind == 'birth' and redis.call('HGET', lk, 'cancel_requested') == '1' then
      -- Cancelled while this birth ran and it did not succeed: never start it again.
      redis.call('HSET', pk, 'state', 'Cancelled', unpack(plan_fields))
      if f[5] == '1' then cancel_plan(uuid .. ':death') end
      finish_life(lk, uuid, 'Stillbirth', now_ms, run_field, record)
    elseif outcome == 'retry' then
      redis.call('HSET', pk, 'state', 'Standby', 'fire_at_ms', next_ms, 'fire_at', next_rfc, unpack(plan_fields))
      redis.call('ZADD', KEYS[2], next_ms, plan_id)
      redis.call('HSET', lk, 'updated_at_ms', now_ms, run_field, record)
      notify_if_soon(next_ms, notify_before)
    elseif outcome == 'done' then
      redis.call('HSET', pk, 'state', 'Done', unpack(plan_fields))
      if kind == 'birth' and f[5] == '1' then
        -- A term's birth: the Life is Alive and its death Plan becomes due.
        local dk = plan_key(uuid .. ':death')
        local death_ms = redis.call('HGET', dk, 'fire_at_ms')
        if redis.call('HGET', lk, 'cancel_requested') == '1' then
          death_ms = now_ms
          redis.call('HSET', dk, 'fire_at_ms', now_ms, 'fire_at', now_rfc)
        end
        redis.call('HSET', lk, 'state', 'Alive', 'updated_at_ms', now_ms, run_field, record)
        redis.call('ZADD', KEYS[2], death_ms, uuid .. ':death')
        notify_if_soon(death_ms, notify_before)
      else
        finish_life(lk, uuid, 'Dead', now_ms, run_field, record)
      end
    else
      redis.call('HSET', pk, 'state', 'Failed', unpack(plan_fields))
      if kind == 'birth' then
        if f[5] == '1' then cancel_plan(uuid .. ':death') end
        finish_life(lk, uuid, 'Stillbirth', now_ms, run_field, record)
      else
        finish_life(lk, uuid, 'Dead', now_ms, run_field, record)
      end
    end
    out[#out + 1] = 'ok'
  end
end
if #done_ids > 0 then redis.call('ZREM', KEYS[1], unpack(done_ids)) end
return out

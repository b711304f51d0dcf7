#!lua flags=allow-oom
-- finish_timer: records one finished run of a timer (Plan `{name}:timer`) and schedules
-- its next slot. The host computed NEXT_MS from the timer's schedule at VERSION; if the
-- timer changed meanwhile (PATCH, activate, deactivate) the reply is 'changed' and
-- nothing is written, so the host computes again. A `next_override_ms` set by a PATCH
-- during the run wins over NEXT_MS. Slots that passed while the run went on (or while no
-- host ran the timer) arrive as SKIPS records and are logged in the timer's runs list.
-- outcome 'retry': the Plan fires again at NEXT_MS for the same slot, unless the timer
--   was deactivated meanwhile: then it rests.
-- outcome 'done' / 'failed': the next slot; an inactive timer (or one that never fires
--   again: NEXT_MS '') rests in state Inactive.
-- A call retried after its reply was lost finds its own `done_by` mark and answers 'ok'
-- without logging the run twice.
-- KEYS: 1 held, 2 timers_due, 3 runs, 4 timer, 5 plan, 6 timer runs list
-- ARGV: 1 prefix, 2 host, 3 name, 4 claim, 5 outcome, 6 next_ms ('' = none),
--       7 next_rfc, 8 version, 9 record JSON, 10 now_ms, 11 notify_before_ms,
--       12 runs stream max length, 13 runs kept per timer, 14 next slot ms ('' = the
--       next fire time itself; else the missed or overlapping slot a run fired at once
--       stands for), 15 catch-up runs (late runs of the catch-up under way, the next
--       included; 0 = none: the counter is dropped), 16 callback Life id and 17 its
--       record ('' = none: see book_callback_record), 18 now_rfc, 19.. skip records (JSON)
-- Returns 'ok' | 'lost' | 'changed'
local host, name, claim, outcome = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
-- The outcome as the run's record says it (`success`, `retry`, `failed`), for the
-- timer's `last_outcome` and the runs stream.
local word = outcome == 'done' and 'success' or outcome
local next_ms, next_rfc, record, now_ms = ARGV[6], ARGV[7], ARGV[9], ARGV[10]
if applied_by(name .. ':timer', host, claim) then return 'ok' end
local t = redis.call('HMGET', KEYS[4], 'version', 'active', 'next_override_ms', 'next_override')
if t[1] and t[1] ~= ARGV[8] then return 'changed' end
local function log_run(entry, word)
  redis.call('LPUSH', KEYS[6], entry)
  add_run(KEYS[3], ARGV[12], 'timer', name, 'outcome', word,
    'record', entry)
end
local plan_id = name .. ':timer'
local f = redis.call('HMGET', KEYS[5], 'state', 'lease_owner', 'claims')
if f[1] ~= 'Running' or f[2] ~= host or f[3] ~= claim then
  if t[1] then log_run(record, word) end
  return 'lost'
end
redis.call('ZREM', KEYS[1], plan_id)
if not t[1] then
  -- Deleted while it ran.
  redis.call('DEL', KEYS[5])
  return 'ok'
end
log_run(record, word)
for i = 19, #ARGV do log_run(ARGV[i], 'skipped') end
if outcome ~= 'retry' then
  book_callback_record(ARGV[16], ARGV[17], now_ms, ARGV[11])
end
redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[13]) - 1)
redis.call('HSET', KEYS[4], 'last_run_at_ms', now_ms, 'last_outcome', word)
redis.call('HSET', KEYS[5], 'done_by', host .. '#' .. claim)
if outcome == 'retry' and t[2] == '1' then
  redis.call('HSET', KEYS[5], 'state', 'Standby', 'fire_at_ms', next_ms, 'fire_at', next_rfc)
  redis.call('ZADD', KEYS[2], next_ms, plan_id)
  notify_if_soon(next_ms, ARGV[11])
  return 'ok'
end
if outcome == 'retry' then
  -- Deactivated while this run failed: no more retries; activate computes the next slot.
  next_ms = ''
end
local slot_ms, catch_up = ARGV[14], ARGV[15]
if outcome ~= 'retry' and t[3] then
  -- A time asked for by a PATCH wins, and ends any catch-up.
  next_ms, next_rfc, slot_ms, catch_up = t[3], t[4], '', '0'
  redis.call('HDEL', KEYS[4], 'next_override_ms', 'next_override')
end
if slot_ms == '' then slot_ms = next_ms end
if catch_up == '0' then
  redis.call('HDEL', KEYS[4], 'catch_up_runs')
else
  redis.call('HSET', KEYS[4], 'catch_up_runs', catch_up)
end
if t[2] == '1' and next_ms ~= '' then
  redis.call('HSET', KEYS[5], 'state', 'Standby', 'fire_at_ms', next_ms, 'fire_at', next_rfc,
    'slot_ms', slot_ms, 'attempts', 0)
  redis.call('HSET', KEYS[4], 'next_run_ms', next_ms, 'next_run', next_rfc)
  redis.call('ZADD', KEYS[2], next_ms, plan_id)
  notify_if_soon(next_ms, ARGV[11])
else
  redis.call('HSET', KEYS[5], 'state', 'Inactive', 'attempts', 0)
  redis.call('HDEL', KEYS[4], 'next_run_ms', 'next_run')
end
return 'ok'

#!lua flags=allow-oom
-- finish_task: records a batch of finished queue-task runs (Plans `{queue}/{task}:task`).
-- outcome 'done': the task is deleted; its name stays taken (tombstone) for TOMBSTONE_MS.
-- outcome 'retry': back to Standby at NEXT_MS (the host computed the queue's backoff).
-- outcome 'failed': retries exhausted; the task moves to the queue's failed list, where
--   a person can inspect it and run it again (task_run).
-- Every run leaves its queue's running set, even when the task was taken over or purged
-- meanwhile, so that max_concurrent never counts a run that ended; the slot it frees
-- goes to the queue's first waiting task.
-- A call retried after its reply was lost answers 'ok' again without writing twice: the
-- Plan carries this run's `done_by` mark, or is gone with a tombstone left.
-- KEYS: 1 held, 2 due_tasks, 3 runs
-- ARGV: 1 prefix, 2 host, 3 now_ms, 4 notify_before_ms, 5 runs stream max length,
--       6 tombstone ms, then per run 10 values: plan_id, claim, outcome, next_ms,
--       status ('' = none), error ('' = none), history outcome word, record JSON,
--       callback Life id and its record ('' = none: see book_callback_record)
-- Returns per run: 'ok' | 'lost'
local host, now_ms, notify_before = ARGV[2], ARGV[3], ARGV[4]
local out, done_ids = {}, {}

local function apply(plan_id, claim, outcome, next_ms, status, err, word, record,
    callback, callback_record)
  local queue, task = string.match(plan_id, '^([^/]+)/(.*):task$')
  local qk = PREFIX .. 'queue:' .. queue
  local pk = plan_key(plan_id)
  local tombstone = PREFIX .. 'tombstone:' .. queue .. '/' .. task
  leave_running(queue, plan_id .. '#' .. claim, notify_before)
  if applied_by(plan_id, host, claim)
      or (redis.call('EXISTS', pk) == 0 and redis.call('EXISTS', tombstone) == 1) then
    return 'ok'
  end
  add_run(KEYS[3], ARGV[5], 'queue', queue, 'task', task,
    'outcome', word, 'record', record)
  local f = redis.call('HMGET', pk, 'state', 'lease_owner', 'claims')
  if f[1] ~= 'Running' or f[2] ~= host or f[3] ~= claim then return 'lost' end
  done_ids[#done_ids + 1] = plan_id
  local fields = {'last_run', record, 'done_by', host .. '#' .. claim}
  if status ~= '' then fields[#fields + 1] = 'last_status'; fields[#fields + 1] = status end
  if err ~= '' then fields[#fields + 1] = 'last_error'; fields[#fields + 1] = err end
  if outcome == 'done' then
    redis.call('DEL', pk)
    redis.call('ZREM', qk .. ':tasks', task)
    redis.call('SET', tombstone, now_ms, 'PX', ARGV[6])
  elseif outcome == 'retry' then
    keep_previous_run(pk)
    redis.call('HSET', pk, 'state', 'Standby', 'fire_at_ms', next_ms, unpack(fields))
    redis.call('ZADD', KEYS[2], next_ms, plan_id)
    notify_if_soon(next_ms, notify_before)
  else
    keep_previous_run(pk)
    redis.call('HSET', pk, 'state', 'Failed', 'failed_at_ms', now_ms, unpack(fields))
    redis.call('ZREM', qk .. ':tasks', task)
    redis.call('ZADD', qk .. ':failed', now_ms, task)
  end
  if outcome ~= 'retry' then
    book_callback_record(callback, callback_record, now_ms, notify_before)
  end
  return 'ok'
end

for i = 7, #ARGV, 10 do
  out[#out + 1] = apply(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
    ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9])
end
if #done_ids > 0 then redis.call('ZREM', KEYS[1], unpack(done_ids)) end
return out

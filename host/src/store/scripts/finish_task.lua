-- finish_task: records a batch of finished queue-task runs (Plans `{queue}/{task}:task`).
-- outcome 'done': the task is deleted; its name stays taken (tombstone) for TOMBSTONE_MS.
-- outcome 'retry': back to Standby at NEXT_MS (the host computed the queue's backoff).
-- outcome 'failed': retries exhausted; the task moves to the queue's failed list, where
--   a person can inspect it and run it again (task_run).
-- Every run leaves its queue's running set, even when the task was taken over or purged
-- meanwhile, so that max_concurrent never counts a run that ended.
-- KEYS: 1 held:{host}, 2 due_tasks, 3 runs
-- ARGV: 1 prefix, 2 host, 3 now_ms, 4 now_rfc, 5 notify_before_ms, 6 runs stream max
--       length, 7 tombstone ms, then per run 9 values: plan_id, claim, outcome, next_ms,
--       next_rfc, status ('' = none), error ('' = none), history outcome word, record JSON
-- Returns per run: 'ok' | 'lost'
local host, now_ms, now_rfc, notify_before = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local out, done_ids = {}, {}
for i = 8, #ARGV, 9 do
  local plan_id, claim, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local next_ms, next_rfc, status, err = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local word, record = ARGV[i + 7], ARGV[i + 8]
  local queue, task = string.match(plan_id, '^([^/]+)/(.*):task$')
  local qk = PREFIX .. 'queue:' .. queue
  redis.call('SREM', qk .. ':running', plan_id .. '#' .. claim)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'queue', queue, 'task', task,
    'outcome', word, 'record', record)
  local pk = plan_key(plan_id)
  local f = redis.call('HMGET', pk, 'state', 'lease_owner', 'claims')
  if f[1] ~= 'Running' or f[2] ~= host or f[3] ~= claim then
    out[#out + 1] = 'lost'
  else
    done_ids[#done_ids + 1] = plan_id
    local fields = {'last_run', record}
    if status ~= '' then fields[#fields + 1] = 'last_status'; fields[#fields + 1] = status end
    if err ~= '' then fields[#fields + 1] = 'last_error'; fields[#fields + 1] = err end
    if outcome == 'done' then
      redis.call('DEL', pk)
      redis.call('ZREM', qk .. ':tasks', task)
      redis.call('SET', PREFIX .. 'tombstone:' .. queue .. '/' .. task, now_rfc, 'PX', ARGV[7])
    elseif outcome == 'retry' then
      redis.call('HSET', pk, 'state', 'Standby', 'fire_at_ms', next_ms, 'fire_at', next_rfc, unpack(fields))
      redis.call('ZADD', KEYS[2], next_ms, plan_id)
      notify_if_soon(next_ms, notify_before)
    else
      redis.call('HSET', pk, 'state', 'Failed', 'failed_at_ms', now_ms, 'failed_at', now_rfc, unpack(fields))
      redis.call('ZREM', qk .. ':tasks', task)
      redis.call('ZADD', qk .. ':failed', now_ms, task)
    end
    out[#out + 1] = 'ok'
  end
end
if #done_ids > 0 then redis.call('ZREM', KEYS[1], unpack(done_ids)) end
return out

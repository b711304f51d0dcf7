-- task_change: DELETE /queues/{q}/tasks/{task} ('delete') or POST .../run ('run').
-- delete: a pending or failed task is removed and its name tombstoned; a running one is
--   refused (it finishes first).
-- run: a pending task fires now (a pull task: may be leased now, its lease if any ended); a failed or expired one goes back into the queue with
--   its attempts reset and fires now; a running one is refused. Both still pass the
--   queue's pause, rate and max_concurrent, but no longer its `expire_after`: a person
--   asked for this run.
-- KEYS: 1 plan, 2 queue tasks index, 3 queue failed list, 4 due_tasks
-- ARGV: 1 prefix, 2 queue, 3 task, 4 mode, 5 now_ms, 6 notify_before_ms, 7 tombstone ms
-- Returns 'ok' | 'missing' | 'running'
local queue, task, mode = ARGV[2], ARGV[3], ARGV[4]
local plan_id = queue .. '/' .. task .. ':task'
task_promote(plan_id)
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state == 'Running' then return 'running' end
release_claim(plan_id)
redis.call('ZREM', KEYS[4], plan_id)
leave_waiting(queue, plan_id)
-- A pull task's lease, if any, ends: its worker's ack or nack is refused.
local pull = redis.call('HGET', KEYS[1], 'pull') == '1'
if pull then
  redis.call('ZREM', PREFIX .. 'queue:' .. queue .. ':leased', task)
  redis.call('HDEL', KEYS[1], 'lease_id', 'lease_expires_ms')
end
if mode == 'delete' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], task)
  redis.call('ZREM', KEYS[3], task)
  redis.call('SET', PREFIX .. 'tombstone:' .. queue .. '/' .. task, ARGV[5], 'PX', ARGV[7])
  return 'ok'
end
if state == 'Failed' or state == 'Expired' then
  redis.call('ZREM', KEYS[3], task)
  redis.call('HDEL', KEYS[1], 'failed_at_ms', 'failed_at', 'first_attempt_ms')
  redis.call('HDEL', KEYS[1], 'attempts')
end
redis.call('HDEL', KEYS[1], 'expires_at_ms')
redis.call('HSET', KEYS[1], 'state', 'Standby', 'fire_at_ms', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[5], task)
if pull then return 'ok' end
redis.call('ZADD', KEYS[4], ARGV[5], plan_id)
notify_if_soon(ARGV[5], ARGV[6])
return 'ok'

-- queue_purge: removes up to BATCH tasks of a queue that are not running (pending and
-- failed), tombstoning their names; with DROP = '1' and nothing left, the queue itself
-- goes too (DELETE /queues/{name}). Running tasks finish first and are then deleted by
-- finish_task or left for the next purge.
-- KEYS: 1 queue, 2 queue tasks index, 3 queue failed list, 4 due_tasks, 5 queues index
-- ARGV: 1 prefix, 2 queue, 3 batch, 4 now_ms, 5 tombstone ms, 6 drop
-- Returns {removed, left} (left counts tasks still there, running ones included)
local queue, batch = ARGV[2], tonumber(ARGV[3])
local removed = 0
for _, index in ipairs({KEYS[2], KEYS[3]}) do
  local names = redis.call('ZRANGE', index, 0, batch - 1)
  for _, task in ipairs(names) do
    local plan_id = queue .. '/' .. task .. ':task'
    local pk = plan_key(plan_id)
    task_promote(plan_id)
    if redis.call('HGET', pk, 'state') ~= 'Running' then
      release_claim(plan_id)
      redis.call('ZREM', KEYS[4], plan_id)
      leave_waiting(queue, plan_id)
      redis.call('ZREM', KEYS[1] .. ':leased', task)
      redis.call('DEL', pk)
      redis.call('ZREM', index, task)
      redis.call('SET', PREFIX .. 'tombstone:' .. queue .. '/' .. task, ARGV[4], 'PX', ARGV[5])
      removed = removed + 1
    end
  end
end
local left = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
if ARGV[6] == '1' and left == 0 then
  redis.call('DEL', KEYS[1], KEYS[1] .. ':running', KEYS[1] .. ':leased', waiting_key(queue),
    KEYS[1] .. ':kwaiting', KEYS[1] .. ':key_running', KEYS[1] .. ':running_key')
  redis.call('ZREM', KEYS[5], queue)
end
return {removed, left}

-- queue_resume: POST /queues/{name}/resume, in batches. The first batch sets the queue
-- running; each puts the queue's parked tasks (Standby, in no due set: start_run parks
-- the tasks of a paused queue as they come due) back in due_tasks at their own times.
-- A task already in due_tasks keeps its time (NX).
-- KEYS: 1 queue, 2 queue tasks index, 3 due_tasks
-- ARGV: 1 prefix, 2 queue, 3 offset, 4 batch, 5 notify_before_ms
-- Returns the number of tasks looked at (less than BATCH: done), or -1: no such queue.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if ARGV[3] == '0' then redis.call('HSET', KEYS[1], 'state', 'running') end
local names = redis.call('ZRANGE', KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[3]) + tonumber(ARGV[4]) - 1)
local earliest
for _, task in ipairs(names) do
  local plan_id = ARGV[2] .. '/' .. task .. ':task'
  local f = redis.call('HMGET', plan_key(plan_id), 'state', 'fire_at_ms')
  if f[1] == 'Standby' and f[2] then
    redis.call('ZADD', KEYS[3], 'NX', f[2], plan_id)
    if not earliest or tonumber(f[2]) < earliest then earliest = tonumber(f[2]) end
  end
end
if earliest then notify_if_soon(earliest, ARGV[5]) end
return #names

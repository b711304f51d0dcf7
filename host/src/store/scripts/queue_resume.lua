-- queue_resume: POST /queues/{name}/resume, in batches. The first call sets the queue
-- running; each moves up to BATCH of its waiting tasks (common.lua: held back in Redis
-- while the queue was paused or full) back to due_tasks at their own times, always from
-- the front of the waiting set, so tasks that finish or come in meanwhile never make it
-- skip one. Interrupted between batches, it is finished by the next resume or by the
-- supervisor's queue_wake, which moves the waiting tasks of running queues.
-- KEYS: 1 queue
-- ARGV: 1 prefix, 2 queue, 3 batch, 4 notify_before_ms
-- Returns the number of tasks still waiting, or -1: no such queue.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HSET', KEYS[1], 'state', 'running')
wake_waiting(ARGV[2], tonumber(ARGV[3]), ARGV[4])
return redis.call('ZCARD', waiting_key(ARGV[2]))

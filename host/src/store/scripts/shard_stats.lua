-- shard_stats: what /metrics shows of a shard: Plans waiting to be claimed (Lives' in the
-- due tree, timers'), queue tasks waiting (due_tasks and the task_due tree), finished
-- Lives kept, those of each past due at NOW, and when the first of them was due.
-- KEYS: 1 due (tree), 2 timers_due, 3 due_tasks, 4 finished (list)
-- ARGV: 1 prefix, 2 now_ms
-- Returns {due, due tasks, finished, overdue, overdue tasks, first due ms ('' = none)}
local now = ARGV[2]
local first = tree_first(KEYS[1])[2]
local timer_first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
if timer_first and (not first or tonumber(timer_first) < tonumber(first)) then first = timer_first end
return {
  tree_count(KEYS[1]) + redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]) + tree_count(task_due_key()),
  redis.call('LLEN', KEYS[4]),
  tree_count_until(KEYS[1], now) + redis.call('ZCOUNT', KEYS[2], '-inf', now),
  redis.call('ZCOUNT', KEYS[3], '-inf', now) + tree_count_until(task_due_key(), now),
  first or '',
}

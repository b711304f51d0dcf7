-- shard_first: the earliest fire time after AFTER ('' = any) of a Plan of the shard not
-- yet finished: waiting (the due tree, timers_due, due_tasks, task_due) or held (Lives' in
-- `inflight`, timers' and tasks' in `held`). For the manual clock, which steps from one
-- to the next (time_travel.rs).
-- KEYS: 1 due (tree), 2 timers_due, 3 due_tasks, 4 held, 5 inflight
-- ARGV: 1 prefix, 2 after ms ('' = any)
-- Returns the time, or '' when there is none.
local after = ARGV[2]
local min = after == '' and '-inf' or '(' .. after
local best = nil
local function consider(ms)
  ms = tonumber(ms)
  if ms and (after == '' or ms > tonumber(after)) and (not best or ms < best) then best = ms end
end
local from = after == '' and 0 or tonumber(after) + 1
consider(tree_range(KEYS[1], from, '', '+inf', 1)[2])
consider(tree_range(task_due_key(), from, '', '+inf', 1)[2])
for i = 2, 4 do
  consider(redis.call('ZRANGEBYSCORE', KEYS[i], min, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
end
for _, v in ipairs(redis.call('HVALS', KEYS[5])) do
  local f = inflight_parse(v)
  if f then consider(f.fire_ms) end
end
return best and tostring(best) or ''

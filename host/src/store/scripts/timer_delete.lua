-- timer_delete: DELETE /timers/{name}. The definition and its runs list go at once; a
-- run under way finishes and then finds no timer (finish_timer deletes the Plan).
-- KEYS: 1 timer, 2 plan, 3 timers_due, 4 timers index, 5 timer runs list
-- ARGV: 1 prefix, 2 name
-- Returns 'ok' | 'missing'
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
local plan_id = ARGV[2] .. ':timer'
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('ZREM', KEYS[4], ARGV[2])
if redis.call('HGET', KEYS[2], 'state') ~= 'Running' then
  release_claim(plan_id)
  redis.call('ZREM', KEYS[3], plan_id)
  redis.call('DEL', KEYS[2])
end
return 'ok'

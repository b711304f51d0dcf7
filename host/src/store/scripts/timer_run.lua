-- timer_run: POST /timers/{name}/run. The timer's Plan fires now, unless it is running
-- (a timer never runs twice at once). After this run the next slot after its end follows
-- (finish_timer), so the schedule goes on as before.
-- KEYS: 1 timer, 2 plan, 3 timers_due
-- ARGV: 1 prefix, 2 name, 3 now_ms, 4 now_rfc, 5 notify_before_ms
-- Returns 'ok' | 'missing' | 'running'
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
local plan_id = ARGV[2] .. ':timer'
if redis.call('HGET', KEYS[2], 'state') == 'Running' then return 'running' end
release_claim(plan_id)
redis.call('HSET', KEYS[2], 'state', 'Standby', 'fire_at_ms', ARGV[3], 'fire_at', ARGV[4],
  'slot_ms', ARGV[3], 'attempts', 0)
redis.call('ZADD', KEYS[3], ARGV[3], plan_id)
notify_if_soon(ARGV[3], ARGV[5])
return 'ok'

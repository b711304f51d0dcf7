-- timer_put: creates a timer (POST /timers) or changes one (PATCH, activate,
-- deactivate), with its one Plan `{name}:timer`. One Plan per timer is what keeps a timer
-- from ever running twice at once, on any number of hosts: the next slot is scheduled
-- only when the run before it has finished (finish_timer).
-- NEXT is the fire time to schedule: epoch ms, 'keep' (leave the Plan's time as it is),
-- or '' (inactive: nothing scheduled). A Plan that is Running keeps running; its next
-- slot is then computed when it finishes, and an explicit time (OVERRIDE = '1') is kept
-- for that moment as next_override_ms (and shown at once as next_run_ms): a `next_run`
-- set by a client after a run started wins over the slot the run's finish computes.
-- KEYS: 1 timer, 2 plan, 3 timers_due, 4 timers index
-- ARGV: 1 prefix, 2 name, 3 mode ('create' | 'update'), 4 expected version (update),
--       5 next ms | 'keep' | '', 6 next rfc, 7 override ('1' = NEXT was asked for),
--       8 action JSON, 9 opts JSON, 10 now_ms, 11 notify_before_ms,
--       12.. field/value pairs of the timer hash
-- Returns {'ok', plan state} | {'duplicate'} | {'missing'} | {'changed'}
local name, mode, next_ms, next_rfc = ARGV[2], ARGV[3], ARGV[5], ARGV[6]
local exists = redis.call('EXISTS', KEYS[1]) == 1
if mode == 'create' and exists then return {'duplicate'} end
if mode == 'update' then
  if not exists then return {'missing'} end
  if (redis.call('HGET', KEYS[1], 'version') or '0') ~= ARGV[4] then return {'changed'} end
end
local fields = {}
for i = 12, #ARGV do fields[#fields + 1] = ARGV[i] end
if #fields > 0 then redis.call('HSET', KEYS[1], unpack(fields)) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'updated_at_ms', ARGV[10])
redis.call('ZADD', KEYS[4], 0, name)
local plan_id = name .. ':timer'
redis.call('HSET', KEYS[2], 'action', ARGV[8], 'opts', ARGV[9])
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'Running' then
  if ARGV[7] == '1' then
    -- A time asked for while a run is under way stands until it fires: the run's finish
    -- (finish_timer) schedules it instead of the slot it computed, and the timer shows
    -- it as its next run from now on.
    redis.call('HSET', KEYS[1], 'next_override_ms', next_ms, 'next_override', next_rfc,
      'next_run_ms', next_ms, 'next_run', next_rfc)
  end
  return {'ok', 'Running'}
end
if next_ms == 'keep' and state == 'Standby' then return {'ok', state} end
if next_ms == 'keep' and state == 'Preset' then
  -- Take it back from the host holding it, so that the new action and options are the
  -- ones that run at the same time.
  release_claim(plan_id)
  local fire_ms = redis.call('HGET', KEYS[2], 'fire_at_ms')
  redis.call('HSET', KEYS[2], 'state', 'Standby')
  redis.call('ZADD', KEYS[3], fire_ms, plan_id)
  notify_if_soon(fire_ms, ARGV[11])
  return {'ok', 'Standby'}
end
release_claim(plan_id)
redis.call('ZREM', KEYS[3], plan_id)
if next_ms == '' or next_ms == 'keep' then
  redis.call('HSET', KEYS[2], 'state', 'Inactive', 'attempts', 0)
  redis.call('HDEL', KEYS[1], 'next_run_ms', 'next_run')
  return {'ok', 'Inactive'}
end
redis.call('HSET', KEYS[2], 'state', 'Standby', 'fire_at_ms', next_ms, 'fire_at', next_rfc,
  'slot_ms', next_ms, 'attempts', 0)
redis.call('HSET', KEYS[1], 'next_run_ms', next_ms, 'next_run', next_rfc)
redis.call('ZADD', KEYS[3], next_ms, plan_id)
notify_if_soon(next_ms, ARGV[11])
return {'ok', 'Standby'}

#!lua flags=allow-oom
-- cancel: DELETE /schedules/{id}.
-- Before birth: the Life becomes Stillbirth and nothing runs. Alive: the death Plan is
-- moved to now (it runs at once). With force: every pending Plan is cancelled and the
-- Life ends without running anything more (Stillbirth before birth, Dead after) — unless
-- a Plan is running: then 'running' (409), try again when it returns.
-- KEYS: 1 life (with its Plans' fields: plan_of in common.lua), 2 due
-- ARGV: 1 prefix, 2 uuid, 3 now_ms, 4 force (1/0), 5 notify_before_ms
-- Returns {'ok', new_state} | {'missing'} | {'finished', state} | {'running'}
local uuid, now_ms, force = ARGV[2], ARGV[3], ARGV[4] == '1'
local f = redis.call('HMGET', KEYS[1], 'state', 'schedule_type')
local state, stype = f[1], f[2]
if not state then return {'missing'} end
if state == 'Dead' or state == 'Stillbirth' or state == 'Invalidated' then
  return {'finished', state}
end
local bk, bn = plan_of(uuid .. ':birth')
local bstate = redis.call('HGET', bk, bn.state)
-- Invariant: a Life is never finished while one of its Plans runs, so that a run in
-- progress can always move its own Life on. Force therefore never touches a Running
-- Plan either.
if state == 'Inexistent' then
  if bstate == 'Running' then
    if stype == 'term' then
      -- The birth is under way: let it finish, then run the death at once (finish_run).
      redis.call('HSET', KEYS[1], 'cancel_requested', 1, 'updated_at_ms', now_ms)
      return {'ok', 'Inexistent'}
    end
    return {'running'}
  end
  cancel_plan(uuid .. ':birth')
  if stype == 'term' then cancel_plan(uuid .. ':death') end
  finish_life(KEYS[1], uuid, 'Stillbirth', now_ms)
  return {'ok', 'Stillbirth'}
end
-- Alive
local dk, dn = plan_of(uuid .. ':death')
local dstate = redis.call('HGET', dk, dn.state)
if dstate == 'Running' then
  if force then return {'running'} end
  -- The death is under way already; a failure retries it as usual.
  redis.call('HSET', KEYS[1], 'cancel_requested', 1, 'updated_at_ms', now_ms)
  return {'ok', 'Alive'}
end
if force then
  cancel_plan(uuid .. ':death')
  finish_life(KEYS[1], uuid, 'Dead', now_ms)
  return {'ok', 'Dead'}
end
redis.call('HSET', KEYS[1], 'cancel_requested', 1, 'updated_at_ms', now_ms)
release_claim(uuid .. ':death')
redis.call('HSET', dk, dn.state, 'Standby', dn.fire_at_ms, now_ms)
redis.call('ZADD', KEYS[2], now_ms, uuid .. ':death')
notify_if_soon(now_ms, ARGV[5])
return {'ok', 'Alive'}

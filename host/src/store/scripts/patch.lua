-- patch: moves times, changes actions or the resource of a Life whose changed Plans have
-- not started (Standby, or Preset: then taken back from the host that holds it).
-- KEYS: 1 life (its Plans are fields of it: plan_of in common.lua), 2 due, 3 lives,
--       4 old resource index, 5 new resource index, 6.. the `plugin-lives:{name}` sets
--       of the plugins the new actions use
-- ARGV: 1 prefix, 2 uuid, 3 expected version, 4 new resource_id ('' = none),
--       5 birth_ms, 6 death_ms ('' for point), 7 birth action JSON, 8 death action JSON,
--       9 now_ms, 10 guard_ms, 11 notify_before_ms, 12 birth changed (1/0),
--       13 death changed (1/0), 14 resource changed (1/0)
-- Returns {'ok'} | {'changed'} | {'cancelled'} | {'not_pending', plan} | {'resource_conflict', other}
local uuid = ARGV[2]
local bk, bn = plan_of(uuid .. ':birth')
local dk, dn = plan_of(uuid .. ':death')
local life = redis.call('HMGET', KEYS[1], 'version', 'state', 'birth_at_ms', 'cancel_requested')
if (life[1] or '0') ~= ARGV[3] then return {'changed'} end
-- After a DELETE, the Life is on its way out: its death must not be moved back.
if life[4] == '1' then return {'cancelled'} end
local birth_changed, death_changed = ARGV[12] == '1', ARGV[13] == '1'
local resource_changed = ARGV[14] == '1'
local bstate = redis.call('HGET', bk, bn.state)
local dstate = redis.call('HGET', dk, dn.state)
local function pending(s) return s == 'Standby' or s == 'Preset' end
if (birth_changed or resource_changed) and not (life[2] == 'Inexistent' and pending(bstate)) then
  return {'not_pending', 'birth'}
end
if death_changed and not pending(dstate) then return {'not_pending', 'death'} end

local birth_ms, death_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
local guard = tonumber(ARGV[10])
if ARGV[4] ~= '' then
  local other = resource_conflict(KEYS[5], birth_ms - guard, (death_ms or birth_ms) + guard, uuid)
  if other then return {'resource_conflict', other} end
end

if birth_changed then
  release_claim(uuid .. ':birth')
  redis.call('HSET', bk, bn.state, 'Standby', bn.fire_at_ms, ARGV[5], bn.action, ARGV[7])
  redis.call('ZADD', KEYS[2], birth_ms, uuid .. ':birth')
  redis.call('ZREM', KEYS[3], lives_member(life[3], uuid))
  redis.call('ZADD', KEYS[3], 0, lives_member(ARGV[5], uuid))
  redis.call('HSET', KEYS[1], 'birth_at_ms', ARGV[5])
  notify_if_soon(ARGV[5], ARGV[11])
end
if death_changed then
  release_claim(uuid .. ':death')
  redis.call('HSET', dk, dn.state, 'Standby', dn.fire_at_ms, ARGV[6], dn.action, ARGV[8])
  redis.call('HSET', KEYS[1], 'death_at_ms', ARGV[6])
  -- Only an Alive Life's death Plan is in the due set.
  if life[2] == 'Alive' then
    redis.call('ZADD', KEYS[2], death_ms, uuid .. ':death')
    notify_if_soon(ARGV[6], ARGV[11])
  end
end
-- The resource's order set follows the Plans' new times (and resource).
local old_rid = redis.call('HGET', KEYS[1], 'resource_id')
if old_rid then
  redis.call('ZREM', order_key(old_rid), uuid .. ':birth', uuid .. ':death')
end
if ARGV[4] ~= '' then
  local b = redis.call('HMGET', bk, bn.state, bn.fire_at_ms)
  if b[1] == 'Standby' or b[1] == 'Preset' or b[1] == 'Running' then
    redis.call('ZADD', order_key(ARGV[4]), b[2], uuid .. ':birth')
  end
  local d = redis.call('HMGET', dk, dn.state, dn.fire_at_ms)
  if d[1] == 'Standby' or d[1] == 'Preset' or d[1] == 'Running' then
    redis.call('ZADD', order_key(ARGV[4]), d[2], uuid .. ':death')
  end
end
if resource_changed or birth_changed then
  redis.call('ZREM', KEYS[4], uuid)
  if ARGV[4] ~= '' then
    redis.call('ZADD', KEYS[5], birth_ms, uuid)
    redis.call('HSET', KEYS[1], 'resource_id', ARGV[4])
  else
    redis.call('HDEL', KEYS[1], 'resource_id')
  end
end
redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'updated_at_ms', ARGV[9])
for i = 6, #KEYS do redis.call('SADD', KEYS[i], uuid) end
return {'ok'}

-- book: creates a Life and its Plans, or nothing.
-- KEYS: 1 life, 2 birth plan, 3 death plan, 4 due, 5 lives, 6 resource index,
--       7.. the `plugin-lives:{name}` sets of the plugins the actions use
-- ARGV: 1 prefix, 2 uuid, 3 schedule_type, 4 resource_id ('' = none),
--       5 birth_ms, 6 birth_rfc, 7 death_ms ('' for point), 8 death_rfc,
--       9 birth action JSON, 10 death action JSON, 11 now_ms, 12 guard_ms,
--       13 notify_before_ms, 14 created_at rfc (11 now_ms is unused here but kept
--       for the argument order shared with patch)
-- Returns {'ok'} | {'resource_conflict', other_uuid} | {'duplicate'} |
--   {'pointer', value}: this is the id's home shard and it points to another shard
--   (the Life is there, or was, or is being booked there)
local uuid, rid = ARGV[2], ARGV[4]
local birth_ms, death_ms = tonumber(ARGV[5]), tonumber(ARGV[7])
local guard = tonumber(ARGV[12])
if rid ~= '' then
  local other = resource_conflict(KEYS[6], birth_ms - guard, (death_ms or birth_ms) + guard, uuid)
  if other then return {'resource_conflict', other} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'duplicate'} end
local pointer = redis.call('GET', PREFIX .. 'ptr:' .. uuid)
if pointer then return {'pointer', pointer} end

-- The uuid and the Plan kind are in the key names; fields hold only what they do not
-- say, so that a pending booking stays small (see docs/redis-layout.md). `version` and
-- `updated_at_ms` appear with the first change.
redis.call('HSET', KEYS[1], 'schedule_type', ARGV[3], 'state', 'Inexistent',
  'birth_at_ms', ARGV[5], 'birth_at', ARGV[6], 'created_at', ARGV[14])
redis.call('HSET', KEYS[2], 'state', 'Standby',
  'fire_at_ms', ARGV[5], 'fire_at', ARGV[6], 'action', ARGV[9], 'attempts', 0)
if rid ~= '' then
  redis.call('HSET', KEYS[1], 'resource_id', rid)
  redis.call('HSET', KEYS[2], 'resource_id', rid)
  redis.call('ZADD', KEYS[6], birth_ms, uuid)
  redis.call('ZADD', order_key(rid), birth_ms, uuid .. ':birth')
  if death_ms then redis.call('ZADD', order_key(rid), death_ms, uuid .. ':death') end
end
if death_ms then
  redis.call('HSET', KEYS[1], 'death_at_ms', ARGV[7], 'death_at', ARGV[8])
  -- The death Plan waits outside the due set until birth is done (finish_run adds it).
  redis.call('HSET', KEYS[3], 'state', 'Standby',
    'fire_at_ms', ARGV[7], 'fire_at', ARGV[8], 'action', ARGV[10], 'attempts', 0)
  if rid ~= '' then redis.call('HSET', KEYS[3], 'resource_id', rid) end
  -- Tells finish_run that this birth makes the Life Alive rather than Dead.
  redis.call('HSET', KEYS[2], 'term', 1)
end
redis.call('ZADD', KEYS[4], birth_ms, uuid .. ':birth')
redis.call('ZADD', KEYS[5], 0, lives_member(ARGV[5], uuid))
for i = 7, #KEYS do redis.call('SADD', KEYS[i], uuid) end
notify_if_soon(ARGV[5], ARGV[13])
return {'ok'}

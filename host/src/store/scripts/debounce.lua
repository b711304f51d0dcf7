-- debounce: books a point Life under a debounce key (Inngest's and Trigger.dev's
-- debounce). While the Life of the key's open window has not started (Inexistent, its
-- birth Standby or Preset, not cancelled), the booking takes its place: the pending
-- Life gets this booking's action and fires at now + period, but never past the cap
-- (its first booking + max_wait); a Preset birth is taken back from its host as PATCH
-- does. Otherwise this booking's Life is booked as new and opens the window. The
-- record, the Lives and their Plans are in the key's shard.
-- KEYS: 1 debounce record, 2 new life, 3 due, 4 lives,
--       5.. the `plugin-lives:{name}` sets of the plugins the action uses
-- ARGV: 1 prefix, 2 new uuid, 3 birth_ms (now + period), 4 action JSON,
--       5 cap_ms (now + max_wait), 6 now_ms, 7 notify_before_ms, 8 debounce key,
--       9 record expiry ms (past the cap)
-- Returns {'debounced', uuid, fire_ms} | {'booked'} | {'duplicate'}
local rec = redis.call('HMGET', KEYS[1], 'life', 'cap_ms')
local fire_ms, action = tonumber(ARGV[3]), ARGV[4]
if rec[1] then
  local uuid = rec[1]
  local lk, plan_id = life_key(uuid), uuid .. ':birth'
  local pk, pn = plan_of(plan_id)
  local life = redis.call('HMGET', lk, 'state', 'birth_at_ms', 'cancel_requested')
  local bstate = redis.call('HGET', pk, pn.state)
  if life[1] == 'Inexistent' and life[3] ~= '1' and (bstate == 'Standby' or bstate == 'Preset') then
    local cap = tonumber(rec[2])
    if cap < fire_ms then fire_ms = cap end
    release_claim(plan_id)
    redis.call('HSET', pk, pn.state, 'Standby', pn.fire_at_ms, fire_ms, pn.action, action)
    redis.call('ZADD', KEYS[3], fire_ms, plan_id)
    redis.call('ZREM', KEYS[4], lives_member(life[2], uuid))
    redis.call('ZADD', KEYS[4], 0, lives_member(tostring(fire_ms), uuid))
    redis.call('HSET', lk, 'birth_at_ms', fire_ms, 'updated_at_ms', ARGV[6])
    redis.call('HINCRBY', lk, 'version', 1)
    redis.call('HINCRBY', lk, 'debounced', 1)
    for i = 5, #KEYS do redis.call('SADD', KEYS[i], uuid) end
    notify_if_soon(fire_ms, ARGV[7])
    return {'debounced', uuid, tostring(fire_ms)}
  end
end
local uuid = ARGV[2]
if redis.call('EXISTS', KEYS[2]) == 1 then return {'duplicate'} end
redis.call('HSET', KEYS[2], 'schedule_type', 'point', 'state', 'Inexistent',
  'birth_at_ms', ARGV[3], 'created_at_ms', ARGV[6], 'debounce_key', ARGV[8],
  'b.state', 'Standby', 'b.fire_at_ms', ARGV[3], 'b.action', action)
census(nil, 'Inexistent')
redis.call('ZADD', KEYS[3], ARGV[3], uuid .. ':birth')
redis.call('ZADD', KEYS[4], 0, lives_member(ARGV[3], uuid))
for i = 5, #KEYS do redis.call('SADD', KEYS[i], uuid) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'life', uuid, 'cap_ms', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[9])
notify_if_soon(ARGV[3], ARGV[7])
return {'booked'}

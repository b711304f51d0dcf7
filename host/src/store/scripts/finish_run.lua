-- finish_run: records a run in the Life's history and moves the state machines on.
-- outcome 'done': birth of a point -> Dead; birth of a term -> Alive and the death Plan
--   joins the due set (at once if a cancel came in meanwhile, or if its time passed);
--   death -> Dead.
-- outcome 'retry': the Plan goes back to Standby at NEXT_MS.
-- outcome 'failed' (birth only; a death is always retried): Stillbirth.
-- A host that lost its claim meanwhile still records the run but changes no state.
-- KEYS: 1 plan, 2 life, 3 held:{host}, 4 due, 5 resource lock ('' when none), 6 history,
--       7 death plan
-- ARGV: 1 prefix, 2 plan_id, 3 host, 4 claim, 5 outcome, 6 now_ms, 7 next_ms,
--       8 next_rfc, 9 kind, 10 uuid, 11 notify_before_ms, 12 last_status, 13 last_error,
--       14.. history field/value pairs
-- Returns {'ok'} | {'lost'}
local plan_id, host, outcome, now_ms = ARGV[2], ARGV[3], ARGV[5], ARGV[6]
local history = {}
for i = 14, #ARGV do history[#history + 1] = ARGV[i] end
redis.call('XADD', KEYS[6], 'MAXLEN', '~', 100, '*', unpack(history))
if KEYS[5] ~= '' and redis.call('GET', KEYS[5]) == plan_id then redis.call('DEL', KEYS[5]) end
redis.call('ZREM', KEYS[3], plan_id)
local f = redis.call('HMGET', KEYS[1], 'state', 'lease_owner', 'claims')
if f[1] ~= 'Running' or f[2] ~= host or f[3] ~= ARGV[4] then return {'lost'} end
redis.call('HDEL', KEYS[1], 'lease_owner')
if ARGV[12] ~= '' then redis.call('HSET', KEYS[1], 'last_status', ARGV[12]) end
if ARGV[13] ~= '' then
  redis.call('HSET', KEYS[1], 'last_error', ARGV[13])
else
  redis.call('HDEL', KEYS[1], 'last_error')
end
redis.call('HSET', KEYS[2], 'updated_at_ms', now_ms)

if outcome == 'retry' then
  redis.call('HSET', KEYS[1], 'state', 'Standby', 'fire_at_ms', ARGV[7], 'fire_at', ARGV[8])
  redis.call('ZADD', KEYS[4], ARGV[7], plan_id)
  notify_if_soon(ARGV[7], ARGV[11])
  return {'ok'}
end

local uuid = ARGV[10]
local life = redis.call('HMGET', KEYS[2], 'schedule_type', 'cancel_requested')
if outcome == 'done' then
  redis.call('HSET', KEYS[1], 'state', 'Done')
  if ARGV[9] == 'birth' and life[1] == 'term' then
    redis.call('HSET', KEYS[2], 'state', 'Alive')
    local death_ms = redis.call('HGET', KEYS[7], 'fire_at_ms')
    if life[2] == '1' then
      death_ms = now_ms
      redis.call('HSET', KEYS[7], 'fire_at_ms', now_ms, 'fire_at', ARGV[8])
    end
    redis.call('ZADD', KEYS[4], death_ms, uuid .. ':death')
    notify_if_soon(death_ms, ARGV[11])
  else
    finish_life(KEYS[2], uuid, 'Dead', now_ms)
  end
  return {'ok'}
end

-- failed
redis.call('HSET', KEYS[1], 'state', 'Failed')
if ARGV[9] == 'birth' then
  if life[1] == 'term' then cancel_plan(uuid .. ':death') end
  finish_life(KEYS[2], uuid, 'Stillbirth', now_ms)
else
  finish_life(KEYS[2], uuid, 'Dead', now_ms)
end
return {'ok'}

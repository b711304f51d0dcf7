-- start_run: Preset -> Running for a batch of Plans, the fencing point before any action
-- runs. For each Plan it refuses when this host no longer holds it under the same claim
-- number (moved, cancelled, or reclaimed after a lost lease), invalidates a birth missed
-- by more than birth_delay_limit_time, and takes the resource's run lock so that Plans of
-- one resource never run at once. Keys are derived from PREFIX (one hash slot on a
-- Cluster when the prefix is a hash tag).
-- KEYS: 1 held:{host}, 2 runs
-- ARGV: 1 prefix, 2 host, 3 now_ms, 4 birth_delay_limit_ms, 5 runs stream max length,
--       then per Plan:
--       plan_id, claim, lock ttl ms
-- Returns per Plan: 'run:{attempts}' | 'lost' | 'busy' | 'invalidated'
local host, now_ms, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 6, #ARGV, 3 do
  local plan_id, claim, lock_ttl = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local uuid, kind = string.match(plan_id, '^(.*):(%a+)$')
  local pk = plan_key(plan_id)
  local f = redis.call('HMGET', pk, 'state', 'lease_owner', 'claims', 'fire_at_ms', 'resource_id', 'attempts')
  local result
  if f[1] ~= 'Preset' or f[2] ~= host or f[3] ~= claim then
    result = 'lost'
  elseif kind == 'birth' and now_ms - tonumber(f[4]) > limit then
    local late = now_ms - tonumber(f[4])
    local err = 'birth missed by ' .. late .. ' ms, more than birth_delay_limit_time'
    redis.call('HSET', pk, 'state', 'Invalidated', 'last_error', err)
    redis.call('HDEL', pk, 'lease_owner')
    redis.call('ZREM', KEYS[1], plan_id)
    cancel_plan(uuid .. ':death')
    local record = cjson.encode({plan = 'birth', attempt = (tonumber(f[6]) or 0) + 1,
      should_run_at = tonumber(f[4]), started_at = now_ms, duration_ms = 0, host = host,
      outcome = 'invalidated', error = err})
    finish_life(life_key(uuid), uuid, 'Invalidated', now_ms, 'run:birth:invalidated', record)
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'life', uuid, 'plan', 'birth',
      'outcome', 'invalidated', 'record', record)
    result = 'invalidated'
  else
    local free = true
    if f[5] then
      -- The lock names the claim, not only the Plan: a stale run of an earlier claim of
      -- the same Plan (a stalled host) must neither share it nor release it.
      local lock, owner = PREFIX .. 'lock:' .. f[5], plan_id .. '#' .. claim
      if not redis.call('SET', lock, owner, 'NX', 'PX', lock_ttl) then
        if redis.call('GET', lock) == owner then
          redis.call('PEXPIRE', lock, lock_ttl)
        else
          free = false
        end
      end
    end
    if free then
      local attempts = (tonumber(f[6]) or 0) + 1
      redis.call('HSET', pk, 'state', 'Running', 'attempts', attempts, 'started_at_ms', ARGV[3])
      result = 'run:' .. attempts
    else
      result = 'busy'
    end
  end
  out[#out + 1] = result
end
return out

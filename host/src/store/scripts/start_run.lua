-- start_run: Preset -> Running, the fencing point before any action runs. Refuses when
-- this host no longer holds the Plan under the same claim (moved, cancelled, or reclaimed
-- after a lost lease), invalidates a birth missed by more than birth_delay_limit_time,
-- and takes the resource's run lock so that Plans of one resource never run at once.
-- KEYS: 1 plan, 2 life, 3 resource lock ('' when none), 4 held:{host}, 5 history,
--       6 death plan
-- ARGV: 1 prefix, 2 plan_id, 3 host, 4 claim, 5 now_ms, 6 lock ttl ms,
--       7 birth_delay_limit_ms, 8 kind, 9 uuid, 10 now_rfc
-- Returns {'run', attempts} | {'lost'} | {'busy'} | {'invalidated', late_ms}
local plan_id, host, now_ms = ARGV[2], ARGV[3], tonumber(ARGV[5])
local f = redis.call('HMGET', KEYS[1], 'state', 'lease_owner', 'claims', 'fire_at_ms')
if f[1] ~= 'Preset' or f[2] ~= host or f[3] ~= ARGV[4] then return {'lost'} end
if ARGV[8] == 'birth' then
  local late = now_ms - tonumber(f[4])
  if late > tonumber(ARGV[7]) then
    local err = 'birth missed by ' .. late .. ' ms, more than birth_delay_limit_time'
    redis.call('HSET', KEYS[1], 'state', 'Invalidated', 'last_error', err)
    redis.call('HDEL', KEYS[1], 'lease_owner')
    redis.call('ZREM', KEYS[4], plan_id)
    cancel_plan(ARGV[9] .. ':death')
    finish_life(KEYS[2], ARGV[9], 'Invalidated', now_ms)
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', 100, '*', 'plan', 'birth',
      'should_run_at', f[4], 'started_at', ARGV[5], 'duration_ms', 0, 'host', host,
      'outcome', 'invalidated', 'error', err)
    return {'invalidated', tostring(late)}
  end
end
if KEYS[3] ~= '' then
  if not redis.call('SET', KEYS[3], plan_id, 'NX', 'PX', ARGV[6]) then
    if redis.call('GET', KEYS[3]) ~= plan_id then return {'busy'} end
    redis.call('PEXPIRE', KEYS[3], ARGV[6])
  end
end
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'state', 'Running', 'started_at_ms', ARGV[5])
return {'run', tostring(attempts)}

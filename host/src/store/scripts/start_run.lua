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
-- A queue task (`{queue}/{task}:task`) must also be admitted by its queue: not paused,
-- fewer than max_concurrent of its tasks running (a set in Redis, so the bound holds
-- across all hosts), and a token in its bucket (refilled at `rate` per second up to
-- `bucket_size`). When it is not, it waits: the k-th task of a queue refused in one call
-- waits for the k-th token, so that waiting tasks come back spread out instead of all at
-- once. A short wait (up to DEFER_AFTER_MS) is spent in the host's memory (its score in
-- held:{host} moves to that time, so that the self-audit does not take it for lost); a
-- longer one back in due_tasks, Standby, so that a backlog waits in Redis and any host
-- may take it when its time comes.
-- Returns per Plan: 'run:{attempts}' | 'lost' | 'busy' | 'invalidated' | 'wait:{ms}' |
--   'deferred' (back in due_tasks)
local host, now_ms, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}

-- 0 when the task may run now (its token taken and its run counted), else ms to wait.
-- PAUSED (a wait of -1): the task is parked, Standby in its queue's task index and in no
-- due set, until `resume` (queue_resume) puts the queue's parked tasks back in due_tasks.
local PAUSED, CONCURRENCY_WAIT_MS, MAX_WAIT_MS = -1, 20, 1000
local DEFER_AFTER_MS = 1000
local refused = {}
local function admit_task(queue, member)
  local k = refused[queue] or 0
  local qk = PREFIX .. 'queue:' .. queue
  local d = redis.call('HMGET', qk, 'state', 'rate', 'bucket_size', 'max_concurrent', 'tokens', 'tokens_at_ms')
  if d[1] == 'paused' then return PAUSED end
  local running = qk .. ':running'
  local max_concurrent = tonumber(d[4]) or 0
  if max_concurrent > 0 and redis.call('SCARD', running) >= max_concurrent then
    refused[queue] = k + 1
    return math.min(CONCURRENCY_WAIT_MS * (1 + math.floor(k / max_concurrent)), MAX_WAIT_MS)
  end
  local rate = tonumber(d[2]) or 0
  if rate > 0 then
    local bucket = math.max(tonumber(d[3]) or 1, 1)
    local tokens = tonumber(d[5]) or bucket
    local elapsed = math.max(now_ms - (tonumber(d[6]) or now_ms), 0)
    tokens = math.min(bucket, tokens + elapsed * rate / 1000)
    if tokens < 1 then
      redis.call('HSET', qk, 'tokens', tostring(tokens), 'tokens_at_ms', now_ms)
      refused[queue] = k + 1
      return math.max(math.ceil((k + 1 - tokens) * 1000 / rate), 1)
    end
    redis.call('HSET', qk, 'tokens', tostring(tokens - 1), 'tokens_at_ms', now_ms)
  end
  redis.call('SADD', running, member)
  return 0
end
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
    local free, wait = true, 0
    local queue = task_queue(plan_id)
    if queue then wait = admit_task(queue, plan_id .. '#' .. claim) end
    if wait ~= 0 then
      free = false
    elseif f[5] then
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
      if queue and attempts == 1 then redis.call('HSET', pk, 'first_attempt_ms', ARGV[3]) end
      result = 'run:' .. attempts
    elseif wait == PAUSED then
      release_claim(pk, plan_id)
      redis.call('HSET', pk, 'state', 'Standby')
      result = 'deferred'
    elseif wait > DEFER_AFTER_MS then
      release_claim(pk, plan_id)
      redis.call('HSET', pk, 'state', 'Standby')
      redis.call('ZADD', PREFIX .. 'due_tasks', now_ms + wait, plan_id)
      result = 'deferred'
    elseif wait > 0 then
      redis.call('ZADD', KEYS[1], 'XX', now_ms + wait, plan_id)
      result = 'wait:' .. wait
    else
      result = 'busy'
    end
  end
  out[#out + 1] = result
end
return out

#!lua flags=allow-oom
-- start_run: Preset -> Running for a batch of Plans, the fencing point before any action
-- runs. For each Plan:
-- - it refuses ('lost') when this host no longer holds it under the same claim number
--   (moved, cancelled, or reclaimed after a lost lease); a Plan already Running under
--   this host and claim answers as when it started (a retry whose first reply was lost
--   gets the applied answer, and the run is not counted twice);
-- - it refuses the whole batch when this host no longer works the shard: 'expired' when
--   its lease on the shard has run out by Redis's clock (another host may be taking the
--   shard over, and this one must renew first), 'lost' when another host owns it;
-- - it holds back a Life's birth later than birth_delay_limit_time (by Redis's clock):
--   'late', which its host records (Invalidated, or for a term birth cut off by a crash
--   before, its death still following);
-- - a Plan of a resource waits ('busy') while an earlier Plan of that resource is
--   unfinished (the resource's order set, see common.lua);
-- - a queue task must be admitted by its queue: not paused, fewer than max_concurrent of
--   its tasks running (a set in Redis, so the bound holds across all hosts), and a token
--   in its bucket (refilled at `rate` per second up to `bucket_size`). A task of a paused
--   or full queue waits in the queue's waiting set, in Redis; one short of tokens is given
--   the next free token (reserve_token below) and goes back to due_tasks for the time it
--   comes. Either way it is Standby and no host holds it, so a saturated queue never
--   takes the room of other work. A task with a key (`ck`, common.lua) must also find
--   its key under the queue's max_concurrent_per_key (else it waits in the key's own
--   waiting set) and a token of the key's bucket (one token at rate_per_key, reserved
--   the same way).
-- - a queue task whose first attempt has not started by its `expires_at_ms` (its ETA plus
--   `expire_after`) never starts: it is dropped ('dropped') into its queue's failed list
--   as Expired, with the reason recorded. Retries of a task that started are not bound.
-- On a standalone Redis one call carries the Plans of many shards, a section each (a
-- shard's own calls carried a few Plans each under load, and each call costs Redis more
-- than its Plans' share of the work); on a Redis Cluster a call is one shard's.
-- KEYS: 1 the first section's inflight (it names the node to call)
-- ARGV: 1 '' (each section brings its shard's prefix), 2 host, 3 birth_delay_limit_ms,
--       4 runs stream max length, then per section: the shard's prefix, the generation
--       of this host's lease on it, the count of its Plans, and per Plan: plan_id,
--       claim, attempt (a Life's Plan: the one this run is, from its record),
--       resource_id (a Life's Plan: '' = none)
-- Returns per Plan, in the order given: 'run:{attempts}' | 'lost' | 'busy' | 'late:{ms}' |
--   'deferred' | 'dropped' | 'expired'. A Life's birth later than birth_delay_limit_time
--   is not started ('late'): its host records it Invalidated (finish_life), still under
--   its claim.
local host, limit, runs_max_len = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now_ms = redis_now_ms()
local now_text = int_arg(now_ms)
local out = {}

-- 0 when the task may run now (its tokens taken and its run counted); WAIT_IN_QUEUE when
-- it must wait for the queue (paused, or max_concurrent reached); WAIT_FOR_KEY when its
-- key runs max_concurrent_per_key tasks already; else ms until it may come back for its
-- token.
local WAIT_IN_QUEUE, WAIT_FOR_KEY = -1, -2

-- A token bucket of RATE tokens a second, BUCKET at most, kept as two times in hash KEY
-- (GCRA, the generic cell rate algorithm, twice):
-- - `tat_ms` hands out tokens: a task that finds none now is given the next one free, at
--   its own time (RESERVED on its return), and goes back to due_tasks until then
--   instead of asking again and again. Tokens go out on a steady grid, so a queue whose
--   bucket is 1 runs at its rate, not at the pace of its tasks' round trips;
-- - `sat_ms` checks the starts themselves: a start may come at most half a token's
--   period sooner than the bucket allows. Tasks that come back late together (a host
--   slowed down) are spread out again rather than started in a burst, while a host
--   that is late by the same few ms at every start keeps the full rate.
-- N is how many tasks of this bucket this call has held back already (they come back a
-- period apart). Returns when to come back (ms; 0: the start may go now), the token the
-- task holds (kept in its Plan while it waits), and the new `sat_ms` to write if it
-- starts (nothing of a start is written before every limit has said yes).
local function take_token(key, tat_ms, sat_ms, rate, bucket, reserved, n)
  local period = 1000 / rate
  local burst = (bucket - 1) * period
  local token = tonumber(reserved)
  if not token then
    local tat = math.max(tonumber(tat_ms) or now_ms, now_ms)
    token = math.max(math.ceil(tat - burst), now_ms)
    redis.call('HSET', key, 'tat_ms', string.format('%.3f', tat + period))
  end
  -- Back before its token's time (another host's clock): wait for it.
  if token > now_ms then return token, token end
  local sat = tonumber(sat_ms) or now_ms
  local start_from = sat - burst - period / 2
  if now_ms < start_from then return math.ceil(start_from + n * period), token end
  return 0, token, string.format('%.3f', math.max(sat, now_ms) + period)
end

-- Admits a task (member `{plan}#{claim}`, key CK or false) of QUEUE whose Plan is PK/PN.
-- TOKEN and KEY_TOKEN are the tokens it was given earlier (false: none): a token given
-- is the task's own when it comes back. A task that must wait for the queue gives its
-- tokens up: it asks again once a slot is free, so that tasks held back by a pause or by
-- max_concurrent never start in a burst above the rate when they are let go.
local held_back = {}
local function admit_task(queue, member, ck, pk, pn, token, key_token)
  local qk = PREFIX .. 'queue:' .. queue
  local d = redis.call('HMGET', qk, 'state', 'rate', 'bucket_size', 'max_concurrent', 'tat_ms',
    'sat_ms', 'max_concurrent_per_key', 'rate_per_key')
  local function wait_for(verdict)
    if token or key_token then redis.call('HDEL', pk, pn.token_ms, pn.key_token_ms) end
    return verdict
  end
  if d[1] == 'paused' then return wait_for(WAIT_IN_QUEUE) end
  local running = qk .. ':running'
  local max_concurrent = tonumber(d[4]) or 0
  if max_concurrent > 0 and redis.call('SCARD', running) >= max_concurrent then
    return wait_for(WAIT_IN_QUEUE)
  end
  local per_key = ck and (tonumber(d[7]) or 0) or 0
  if per_key > 0 and (tonumber(redis.call('HGET', qk .. ':key_running', ck)) or 0) >= per_key then
    return wait_for(WAIT_FOR_KEY)
  end
  local rate, key_rate = tonumber(d[2]) or 0, ck and (tonumber(d[8]) or 0) or 0
  -- The key's token first, then the queue's: a task waiting for its key holds no token
  -- of the queue that other keys' tasks could use meanwhile.
  local kb, key_sat
  if key_rate > 0 then
    kb = qk .. ':kbucket:' .. ck
    local b = redis.call('HMGET', kb, 'tat_ms', 'sat_ms')
    local until_ms, held
    until_ms, held, key_sat = take_token(kb, b[1], b[2], key_rate, 1, key_token,
      held_back[kb] or 0)
    local tat = tonumber(redis.call('HGET', kb, 'tat_ms')) or now_ms
    redis.call('PEXPIRE', kb, math.ceil(math.max(tat - now_ms, 0) + 1000 / key_rate) + 1000)
    if until_ms > 0 then
      held_back[kb] = (held_back[kb] or 0) + 1
      redis.call('HSET', pk, pn.key_token_ms, held)
      return until_ms - now_ms
    end
    key_token = held
  end
  local queue_sat
  if rate > 0 then
    local until_ms, held
    until_ms, held, queue_sat = take_token(qk, d[5], d[6], rate,
      math.max(tonumber(d[3]) or 1, 1), token, held_back[qk] or 0)
    if until_ms > 0 then
      held_back[qk] = (held_back[qk] or 0) + 1
      -- It keeps the key's token too: it is its own when it comes back.
      if key_token then
        redis.call('HSET', pk, pn.token_ms, held, pn.key_token_ms, key_token)
      else
        redis.call('HSET', pk, pn.token_ms, held)
      end
      return until_ms - now_ms
    end
  end
  if key_sat then redis.call('HSET', kb, 'sat_ms', key_sat) end
  if queue_sat then redis.call('HSET', qk, 'sat_ms', queue_sat) end
  if token or key_token then redis.call('HDEL', pk, pn.token_ms, pn.key_token_ms) end
  redis.call('SADD', running, member)
  if per_key > 0 then
    redis.call('HINCRBY', qk .. ':key_running', ck, 1)
    redis.call('HSET', qk .. ':running_key', member, ck)
  end
  return 0
end

-- A task whose first attempt did not start by its expires_at_ms (f[9]): into its
-- queue's failed list as Expired, never run.
local function drop_expired_task(plan_id, pk, pn, f)
  local queue, task = string.match(plan_id, '^([^/]+)/(.*):task$')
  local qk = PREFIX .. 'queue:' .. queue
  local err = 'not started by ' .. f[9] .. ' ms (its expire_after past its ETA); dropped at '
    .. now_ms .. ' ms, never run'
  local record = cjson.encode({plan = 'task', attempt = 1, should_run_at = tonumber(f[4]),
    started_at = now_ms, duration_ms = 0, host = host, outcome = 'expired', error = err})
  release_claim(plan_id)
  redis.call('HSET', pk, pn.state, 'Expired', pn.last_error, err, pn.last_run, record,
    pn.failed_at_ms, now_ms)
  redis.call('ZREM', qk .. ':tasks', task)
  redis.call('ZADD', qk .. ':failed', now_ms, task)
  add_run(PREFIX .. 'runs', runs_max_len, 'queue', queue, 'task', task, 'outcome', 'expired',
    'record', record)
end

local function start_plan(plan_id, claim)
  local pk, pn = plan_of(plan_id)
  local f = redis.call('HMGET', pk, pn.state, pn.lease_owner, pn.claims, pn.fire_at_ms,
    pn.resource_id, pn.attempts, pn.interrupted, pn.term, pn.expires_at_ms, pn.ck,
    pn.token_ms, pn.key_token_ms)
  local result
  if f[1] == 'Running' and f[2] == host and f[3] == claim then
    result = 'run:' .. (f[6] or '1')
  elseif f[1] ~= 'Preset' or f[2] ~= host or f[3] ~= claim then
    result = 'lost'
  elseif f[9] and now_ms > tonumber(f[9]) and (tonumber(f[6]) or 0) == 0 then
    drop_expired_task(plan_id, pk, pn, f)
    result = 'dropped'
  else
    local queue = task_queue(plan_id)
    local wait = 0
    local first = true
    if f[5] then
      local head = redis.call('ZRANGE', order_key(f[5]), 0, 0)[1]
      first = head == nil or head == plan_id
    end
    if first and queue then
      wait = admit_task(queue, plan_id .. '#' .. claim, f[10], pk, pn, f[11], f[12])
    end
    if not first then
      result = 'busy'
    elseif wait == 0 then
      local attempts = (tonumber(f[6]) or 0) + 1
      if queue and attempts == 1 then
        redis.call('HSET', pk, pn.state, 'Running', pn.attempts, attempts, pn.started_at_ms, now_ms,
          pn.first_attempt_ms, now_ms)
      else
        redis.call('HSET', pk, pn.state, 'Running', pn.attempts, attempts, pn.started_at_ms, now_ms)
      end
      result = 'run:' .. attempts
    else
      release_claim(plan_id)
      redis.call('HSET', pk, pn.state, 'Standby')
      if wait == WAIT_IN_QUEUE then
        redis.call('ZADD', waiting_key(queue), f[4], plan_id)
      elseif wait == WAIT_FOR_KEY then
        redis.call('ZADD', key_waiting_key(queue, f[10]), f[4], plan_id)
        redis.call('SADD', PREFIX .. 'queue:' .. queue .. ':kwaiting', f[10])
      else
        redis.call('ZADD', PREFIX .. 'due_tasks', now_ms + wait, plan_id)
      end
      result = 'deferred'
    end
  end
  return result
end

-- The section of N Plans whose arguments begin at ARGV[A], in the current shard, which
-- this host works under generation GEN. A Life's Plans have their claims in `inflight`,
-- read for the whole section at once.
local function start_section(a, n, gen)
  local last = a + (n - 1) * 4
  local owned = ownership(host, gen)
  if owned ~= 'ok' then
    for _ = 1, n do out[#out + 1] = owned end
    return
  end
  local inflight_key = PREFIX .. 'inflight'
  -- Each Plan's kind, by the index of its arguments: ':birth' / ':death' for a Life's.
  local tails, life_ids, lives = {}, {}, 0
  for i = a, last, 4 do
    local tail = string.sub(ARGV[i], -6)
    if tail == ':birth' or tail == ':death' then
      tails[i] = tail
      lives = lives + 1
      life_ids[lives] = ARGV[i]
    end
  end
  local life_inflight = {}
  if lives > 0 then
    local values = redis.call('HMGET', inflight_key, unpack(life_ids))
    for i = 1, lives do life_inflight[life_ids[i]] = values[i] end
  end
  local started, n_started = {}, 0

  local function start_life(plan_id, claim, attempt, rid, birth)
    local v = life_inflight[plan_id]
    local bar, runs_from = inflight_holds(v, claim, host)
    if not bar then return 'lost' end
    -- A start retried after its reply was lost gets the applied answer: the attempt is
    -- the entry's last field.
    if runs_from then
      return 'run:' .. string.sub(v, string.find(v, '|', runs_from + 1, true) + 1)
    end
    if birth then
      local fire_ms = tonumber(string.sub(v, bar + 1, string.find(v, '|', bar + 1, true) - 1))
      if now_ms - fire_ms > limit then return 'late:' .. int_arg(now_ms - fire_ms) end
    end
    if rid ~= '' then
      local head = redis.call('ZRANGE', order_key(rid), 0, 0)[1]
      if head and head ~= plan_id then return 'busy' end
    end
    started[n_started + 1] = plan_id
    started[n_started + 2] = v .. '|' .. now_text .. '|' .. attempt
    n_started = n_started + 2
    return 'run:' .. attempt
  end

  local o = #out
  for i = a, last, 4 do
    local plan_id, claim, tail = ARGV[i], ARGV[i + 1], tails[i]
    o = o + 1
    if tail then
      out[o] = start_life(plan_id, claim, ARGV[i + 2], ARGV[i + 3], tail == ':birth')
    else
      out[o] = start_plan(plan_id, claim)
    end
  end
  if n_started > 0 then redis.call('HSET', inflight_key, unpack(started)) end
end

local a = 5
while a <= #ARGV do
  enter_shard(ARGV[a])
  local n = tonumber(ARGV[a + 2])
  if n > 0 then start_section(a + 3, n, ARGV[a + 1]) end
  a = a + 3 + n * 4
end
return out

-- Helpers shared by the scripts below; kairos prepends this file to each of them.
-- Every key is built from PREFIX (ARGV[1] of every script): the prefix of one shard,
-- `{key_prefix}:{tag}:`, so that a script touches the keys of one shard only, all in one
-- Redis Cluster slot (store/shards.rs).

local PREFIX = ARGV[1]

local function plan_key(plan_id) return PREFIX .. 'plan:' .. plan_id end
local function life_key(uuid) return PREFIX .. 'life:' .. uuid end

-- Where a Plan's fields are. A Life's Plans (`{uuid}:birth`, `{uuid}:death`) are fields
-- of the Life's own hash, named with `b.` and `d.` in front (`b.state`, `d.fire_at_ms`),
-- so that a Life is one key; their `resource_id` is the Life's own field. A timer's or a
-- task's Plan is a hash of its own, `plan:{id}`, with plain names. Scripts reach a Plan
-- through plan_of, never by its key, so they need not know which:
--   local pk, pn = plan_of(plan_id)
--   redis.call('HMGET', pk, pn.state, pn.fire_at_ms)
-- PN[prefix] is the table of a prefix's field names (pn.state is 'b.state'), each made
-- on first use and kept for the rest of the script call: building a Lua string per
-- field and Plan would cost about what the Redis command does.
local PN = {}
local function field_names(prefix)
  local names = PN[prefix]
  if not names then
    names = setmetatable({}, {__index = function(t, name)
      local full = (prefix == '' or name == 'resource_id') and name or prefix .. name
      rawset(t, name, full)
      return full
    end})
    PN[prefix] = names
  end
  return names
end

-- The key of a Plan's fields, and their names there.
local function plan_of(plan_id)
  -- Cheaper than a pattern: both kinds of a Life's Plan are five letters long.
  local tail = string.sub(plan_id, -6)
  if tail == ':birth' then
    return PREFIX .. 'life:' .. string.sub(plan_id, 1, -7), field_names('b.')
  elseif tail == ':death' then
    return PREFIX .. 'life:' .. string.sub(plan_id, 1, -7), field_names('d.')
  end
  return plan_key(plan_id), field_names('')
end

-- Whether the Plan exists (every Plan has a `state`).
local function plan_exists(plan_id)
  local pk, pn = plan_of(plan_id)
  return redis.call('HEXISTS', pk, pn.state) == 1
end

-- The member of {prefix}:lives for a Life: zero-padded birth ms, ':', uuid, so that
-- ZRANGEBYLEX lists Lives by birth time and a member is an exact pagination cursor.
local function lives_member(birth_ms, uuid)
  local s = tostring(birth_ms)
  return string.rep('0', 13 - #s) .. s .. ':' .. uuid
end

-- Takes a Plan back from the host that holds it in memory. The holder's timer entry
-- then fails the fencing check of start_run (state or claim number differ) and is
-- dropped, so a Plan moved by PATCH or DELETE never fires at its old time.
local function release_claim(plan_id)
  local pk, pn = plan_of(plan_id)
  if redis.call('HDEL', pk, pn.lease_owner) == 1 then
    redis.call('ZREM', PREFIX .. 'held', plan_id)
  end
end

-- Marks a Life finished: it no longer blocks its resource and is swept after retention.
-- Extra field/value pairs (a run record) are written in the same HSET.
-- Lives per state in the shard (`census`, a hash: state -> count). Each script that
-- creates a Life, changes its state or deletes it counts the change here, so that the
-- overview reads five numbers a shard instead of every Life. FROM or TO may be nil/false
-- (a Life created or deleted). `census_rebuild` recounts a shard whose census lacks its
-- `v` mark (a keyspace written before it).
-- A script that changes many Lives (finish_run) calls `batch_begin` first and
-- `batch_end` last: between the two, census changes add up in memory and finished Lives
-- wait in a list, written as one HINCRBY a state and one ZADD at the end, instead of
-- three commands a Life (each call from Lua into Redis costs about as much as the
-- command itself).
local census_batch, finished_batch = nil, nil
local CENSUS_STATES = {'Inexistent', 'Alive', 'Dead', 'Stillbirth', 'Invalidated'}

local function census(from, to)
  if census_batch then
    if from then census_batch[from] = (census_batch[from] or 0) - 1 end
    if to then census_batch[to] = (census_batch[to] or 0) + 1 end
    return
  end
  if from then redis.call('HINCRBY', PREFIX .. 'census', from, -1) end
  if to then redis.call('HINCRBY', PREFIX .. 'census', to, 1) end
end

local function finish_life(lk, uuid, state, now_ms, ...)
  census(redis.call('HGET', lk, 'state'), state)
  redis.call('HSET', lk, 'state', state, 'finished_at_ms', now_ms, 'updated_at_ms', now_ms, ...)
  if finished_batch then
    finished_batch[#finished_batch + 1] = now_ms
    finished_batch[#finished_batch + 1] = uuid
  else
    redis.call('ZADD', PREFIX .. 'finished', now_ms, uuid)
  end
end

local function batch_begin()
  census_batch, finished_batch = {}, {}
end

local function batch_end()
  for _, state in ipairs(CENSUS_STATES) do
    local n = census_batch[state]
    if n and n ~= 0 then redis.call('HINCRBY', PREFIX .. 'census', state, n) end
  end
  -- ZADD in pieces of 500 members: unpack has a stack limit.
  for i = 1, #finished_batch, 1000 do
    redis.call('ZADD', PREFIX .. 'finished',
      unpack(finished_batch, i, math.min(i + 999, #finished_batch)))
  end
  census_batch, finished_batch = nil, nil
end

-- Redis's own clock, in ms: the one clock every host agrees on. Scripts that judge
-- lateness or leases use it, never the caller's (a host frozen and resumed has a stale
-- idea of now).
local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether HOST works this shard under generation GEN: it owns the shard's lease
-- (`owner`: host, gen, until) and the lease has not run out by Redis's clock.
-- 'ok' | 'expired' (ours, but run out: renew first) | 'lost' (another owner, or none).
local function ownership(host, gen)
  local o = redis.call('HMGET', PREFIX .. 'owner', 'host', 'gen', 'until')
  if o[1] ~= host or o[2] ~= gen then return 'lost' end
  if tonumber(o[3] or 0) < redis_now_ms() then return 'expired' end
  return 'ok'
end

-- The unfinished Plans of a resource, scored by the time each is due: a resource's Plan
-- runs only when it is the first of them (start_run), so the Plans of one resource never
-- overlap and never run out of order, across hosts and crashes. Booking adds a Life's
-- Plans; a Plan leaves when it ends for good (done, failed, cancelled, invalidated).
local function order_key(rid) return PREFIX .. 'order:' .. rid end

-- RID is the Plan's resource_id when the caller has read it already (false: it has none);
-- left out, it is read here.
local function leave_order(plan_id, rid)
  if rid == nil then
    local pk, pn = plan_of(plan_id)
    rid = redis.call('HGET', pk, pn.resource_id)
  end
  if rid then redis.call('ZREM', order_key(rid), plan_id) end
end

-- Appends a run to the shard's capped `runs` stream, for operators to tail. The run's
-- history proper lives with its Life, timer or task; the stream is a second copy that
-- costs Redis CPU and memory on every fire, so it is off unless the operator sets
-- runs_stream_max_len (MAX_LEN '0': off).
local function add_run(stream, max_len, ...)
  if max_len ~= '0' then
    redis.call('XADD', stream, 'MAXLEN', '~', max_len, '*', ...)
  end
end

-- Cancels a Plan that has not run (Standby or Preset); a Plan in any other state is left.
local function cancel_plan(plan_id)
  local pk, pn = plan_of(plan_id)
  local state = redis.call('HGET', pk, pn.state)
  if state == 'Standby' or state == 'Preset' then
    release_claim(plan_id)
    redis.call('ZREM', PREFIX .. 'due', plan_id)
    redis.call('HSET', pk, pn.state, 'Cancelled')
    leave_order(plan_id)
  end
end

-- The first other Life on the resource whose [birth, death or birth] span meets
-- [lo, hi], counting only Lives still pending or alive; false when there is none.
local function resource_conflict(res_key, lo, hi, exclude)
  local ids = redis.call('ZRANGEBYSCORE', res_key, '-inf', hi)
  for _, id in ipairs(ids) do
    if id ~= exclude then
      local f = redis.call('HMGET', life_key(id), 'state', 'birth_at_ms', 'death_at_ms')
      if f[1] == 'Inexistent' or f[1] == 'Alive' then
        if tonumber(f[3] or f[2]) >= lo then return id end
      end
    end
  end
  return false
end

-- The queue of a task's Plan id (`{queue}/{task}:task`), nil for other Plans.
local function task_queue(plan_id)
  return string.match(plan_id, '^([^/]+)/.*:task$')
end

-- Wakes the shard's owner (`{prefix}:{tag}:notify`; hosts listen on every shard's
-- channel with one pattern) when a Plan became due within the look-ahead window.
local function notify_if_soon(fire_ms, notify_before_ms)
  if tonumber(fire_ms) <= tonumber(notify_before_ms) then
    redis.call('PUBLISH', PREFIX .. 'notify', fire_ms)
  end
end

-- Books the callback of a Plan that finished for good (model::Callbacks): a point Life
-- `uuid`, due at once, in this shard (the host drew the id to have this shard as its
-- home). Nothing when UUID is '' or the Life exists (a finish written twice).
local function book_callback(uuid, action, of, now_ms, notify_before_ms)
  if uuid == '' then return end
  local lk = life_key(uuid)
  if redis.call('EXISTS', lk) == 1 then return end
  redis.call('HSET', lk, 'schedule_type', 'point', 'state', 'Inexistent', 'birth_at_ms', now_ms,
    'created_at_ms', now_ms, 'callback_of', of)
  census(nil, 'Inexistent')
  local pk, pn = plan_of(uuid .. ':birth')
  redis.call('HSET', pk, pn.state, 'Standby', pn.fire_at_ms, now_ms, pn.action, action)
  redis.call('ZADD', PREFIX .. 'due', now_ms, uuid .. ':birth')
  redis.call('ZADD', PREFIX .. 'lives', 0, lives_member(now_ms, uuid))
  local ok, a = pcall(cjson.decode, action)
  if ok and type(a) == 'table' and type(a.plugin) == 'string' then
    redis.call('SADD', PREFIX .. 'plugin-lives:' .. string.match(a.plugin, '^[^@]+'), uuid)
  end
  notify_if_soon(now_ms, notify_before_ms)
end

-- A queue's tasks held back in Redis, Standby and in no due set: while the queue is
-- paused, or while it runs max_concurrent tasks already. They wait there costing no
-- host's memory, scored by their fire time, until a slot frees (finish_task, a
-- hand-back), the queue resumes or its limit grows (queue_put, queue_resume), or the
-- supervisor's periodic look (queue_wake) finds room.
local function waiting_key(queue) return PREFIX .. 'queue:' .. queue .. ':waiting' end

-- Moves up to N tasks of a running queue from its waiting set WK back to due_tasks,
-- oldest first. Returns how many moved.
local function wake_from(queue, wk, n, notify_before_ms)
  if n <= 0 then return 0 end
  if redis.call('HGET', PREFIX .. 'queue:' .. queue, 'state') == 'paused' then return 0 end
  local items = redis.call('ZRANGE', wk, 0, n - 1, 'WITHSCORES')
  if #items == 0 then return 0 end
  local ids = {}
  for i = 1, #items, 2 do
    ids[#ids + 1] = items[i]
    redis.call('ZADD', PREFIX .. 'due_tasks', items[i + 1], items[i])
  end
  redis.call('ZREM', wk, unpack(ids))
  notify_if_soon(items[2], notify_before_ms)
  return #ids
end

-- Moves up to N waiting tasks of a running queue back to due_tasks, oldest first.
local function wake_waiting(queue, n, notify_before_ms)
  return wake_from(queue, waiting_key(queue), n, notify_before_ms)
end

-- Per-key limits (a queue's `key`, `max_concurrent_per_key`, `rate_per_key`): a task
-- carries its key's value as `ck` (task_add). A task whose key runs its
-- max_concurrent_per_key already waits in that key's own waiting set, so that one busy
-- key never stands in front of the others; `kwaiting` lists the keys that have one.
-- `key_running` counts each key's runs, `running_key` names the key of each run
-- (`{plan}#{claim}` -> ck).
local function key_waiting_key(queue, ck)
  return PREFIX .. 'queue:' .. queue .. ':kwait:' .. ck
end

-- Drops key CK from the queue's `kwaiting` once its waiting set WK is empty.
local function forget_idle_key(queue, ck, wk)
  if redis.call('EXISTS', wk) == 0 then
    redis.call('SREM', PREFIX .. 'queue:' .. queue .. ':kwaiting', ck)
  end
end

-- Moves up to N of a key's waiting tasks back to due_tasks, oldest first (start_run
-- checks the key's limit again), and drops the key from `kwaiting` once none waits.
-- Returns how many moved.
local function wake_key(queue, ck, n, notify_before_ms)
  local wk = key_waiting_key(queue, ck)
  local moved = wake_from(queue, wk, n, notify_before_ms)
  forget_idle_key(queue, ck, wk)
  return moved
end

-- A task leaves whichever waiting set holds it (deleted, purged, or run by hand).
local function leave_waiting(queue, plan_id)
  redis.call('ZREM', waiting_key(queue), plan_id)
  local pk, pn = plan_of(plan_id)
  local ck = redis.call('HGET', pk, pn.ck)
  if ck then
    local wk = key_waiting_key(queue, ck)
    if redis.call('ZREM', wk, plan_id) == 1 then forget_idle_key(queue, ck, wk) end
  end
end

-- A queue task's run is over (finished, handed back or purged): it leaves the queue's
-- running set and its key's count, and the slot it frees goes to the first waiting task
-- of the queue and of its key. Under max_concurrent, every slot free now goes to a
-- waiting task, not only this one: a task woken may still have to wait for its token
-- (start_run reserves it and leaves the slot free meanwhile), and the tasks behind it
-- must be able to reserve the tokens that follow, or the queue would run one token's
-- round trip at a time, below its rate.
local function leave_running(queue, member, notify_before_ms)
  local qk = PREFIX .. 'queue:' .. queue
  local running = qk .. ':running'
  if redis.call('SREM', running, member) == 1 then
    local max_concurrent = tonumber(redis.call('HGET', qk, 'max_concurrent')) or 0
    local free = 1
    if max_concurrent > 0 then
      free = math.max(max_concurrent - redis.call('SCARD', running), 1)
    end
    wake_waiting(queue, free, notify_before_ms)
  end
  local ck = redis.call('HGET', qk .. ':running_key', member)
  if ck then
    redis.call('HDEL', qk .. ':running_key', member)
    if redis.call('HINCRBY', qk .. ':key_running', ck, -1) <= 0 then
      redis.call('HDEL', qk .. ':key_running', ck)
    end
    wake_key(queue, ck, 1, notify_before_ms)
  end
end

-- Puts a Plan held in this shard (Preset or Running) back into the due set at its own
-- fire time; returns 1 if it moved, 0 if it was not held any more. A Running Plan moves
-- only if it started before RUNNING_BEFORE_MS (nil: any), so that a live host's audit
-- never takes away a run that has just begun; CLAIM, when given, must be the Plan's
-- claim (the audit hands back one claim it knows is lost, never a newer one). A run cut
-- off this way may have reached its target: the attempt is written into the Plan's
-- history as interrupted (with the host that ran it), and the Plan is marked so that a
-- late birth that may have been delivered is still followed by its death (start_run).
-- The caller removes moved Plans from `held`.
local function hand_back(plan_id, notify_before_ms, running_before_ms, claim)
  local pk, pn = plan_of(plan_id)
  local f = redis.call('HMGET', pk, pn.state, pn.lease_owner, pn.fire_at_ms, pn.started_at_ms,
    pn.claims, pn.attempts)
  if f[1] == 'Running' and running_before_ms
      and tonumber(f[4] or 0) >= tonumber(running_before_ms) then
    return -1
  end
  if claim and f[5] ~= claim then return 0 end
  local host = f[2] or '?'
  if f[1] == 'Preset' or f[1] == 'Running' then
    local queue = task_queue(plan_id)
    if f[1] == 'Running' then
      local now_ms = redis_now_ms()
      local err = 'host ' .. host .. ' stopped (crashed or lost its lease) while this ran; it may have reached its target, and runs again'
      redis.call('HSET', pk, pn.state, 'Standby', pn.last_error, err, pn.interrupted, 1)
      local attempt = tonumber(f[6]) or 1
      local word = string.match(plan_id, ':(%a+)$')
      local record = cjson.encode({plan = word, attempt = attempt,
        should_run_at = tonumber(f[3]), started_at = tonumber(f[4]),
        duration_ms = math.max(now_ms - (tonumber(f[4]) or now_ms), 0), host = host,
        outcome = 'interrupted', error = err})
      if queue then
        -- A queue task's run no longer counts against its queue's max_concurrent.
        leave_running(queue, plan_id .. '#' .. f[5], notify_before_ms)
        redis.call('HSET', pk, pn.last_run, record)
      elseif word == 'timer' then
        redis.call('LPUSH', PREFIX .. 'timer:' .. string.sub(plan_id, 1, -7) .. ':runs', record)
      else
        local uuid = string.sub(plan_id, 1, -(#word + 2))
        local lk = life_key(uuid)
        if redis.call('EXISTS', lk) == 1 then
          redis.call('HSET', lk, 'run:' .. word .. ':' .. attempt, record)
        end
      end
      -- Rare (a crash or a lost lease): into the stream when the operator keeps one.
      if redis.call('EXISTS', PREFIX .. 'runs') == 1 then
        add_run(PREFIX .. 'runs', '100000', 'plan', plan_id, 'outcome', 'interrupted',
          'record', record)
      end
    else
      redis.call('HSET', pk, pn.state, 'Standby')
    end
    redis.call('HDEL', pk, pn.lease_owner)
    if queue then
      redis.call('ZADD', PREFIX .. 'due_tasks', f[3], plan_id)
    else
      redis.call('ZADD', PREFIX .. 'due', f[3], plan_id)
    end
    notify_if_soon(f[3], notify_before_ms)
    return 1
  end
  return 0
end

-- Whether this host already applied the outcome of this claim's run (a retried call
-- whose first reply was lost): finish scripts mark the Plan with `done_by` = host#claim.
local function applied_by(plan_id, host, claim)
  local pk, pn = plan_of(plan_id)
  return redis.call('HGET', pk, pn.done_by) == host .. '#' .. claim
end

-- Books a Life and its Plans, or nothing (the body of book.lua, shared with book_idem.lua).
-- KEYS: 1 life, 2 due, 3 lives, 4 resource index,
--       FIRST_PLUGIN_KEY.. the `plugin-lives:{name}` sets of the plugins the actions use
-- ARGV: 1 prefix, 2 uuid, 3 schedule_type, 4 resource_id ('' = none), 5 birth_ms,
--       6 death_ms ('' for point), 7 birth action JSON, 8 death action JSON, 9 now_ms,
--       10 guard_ms, 11 notify_before_ms (the order patch.lua's arguments begin with)
-- Returns {'ok'} | {'resource_conflict', other_uuid} | {'duplicate'} |
--   {'pointer', value}: this is the id's home shard and it points to another shard
--   (the Life is there, or was, or is being booked there)
local function book_life(first_plugin_key)
  local uuid, rid = ARGV[2], ARGV[4]
  local birth_ms, death_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
  local guard = tonumber(ARGV[10])
  if rid ~= '' then
    local other = resource_conflict(KEYS[4], birth_ms - guard, (death_ms or birth_ms) + guard, uuid)
    if other then return {'resource_conflict', other} end
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then return {'duplicate'} end
  local pointer = redis.call('GET', PREFIX .. 'ptr:' .. uuid)
  if pointer then return {'pointer', pointer} end

  -- One HSET writes the Life and its Plans (plan_of). The uuid and the Plan kind are in
  -- the key and field names; fields hold only what they do not say, times in ms only
  -- (the API renders them), so that a pending booking stays small (see
  -- docs/redis-layout.md). `attempts` appears with the first run, `version` and
  -- `updated_at_ms` with the first change.
  local fields = {'schedule_type', ARGV[3], 'state', 'Inexistent', 'birth_at_ms', ARGV[5],
    'created_at_ms', ARGV[9], 'b.state', 'Standby', 'b.fire_at_ms', ARGV[5], 'b.action', ARGV[7]}
  local function add(...)
    for _, v in ipairs({...}) do fields[#fields + 1] = v end
  end
  if rid ~= '' then
    add('resource_id', rid)
    redis.call('ZADD', KEYS[4], birth_ms, uuid)
    redis.call('ZADD', order_key(rid), birth_ms, uuid .. ':birth')
    if death_ms then redis.call('ZADD', order_key(rid), death_ms, uuid .. ':death') end
  end
  if death_ms then
    -- The death Plan waits outside the due set until birth is done (finish_run adds it).
    -- `b.term` tells finish_run that this birth makes the Life Alive rather than Dead.
    add('death_at_ms', ARGV[6], 'd.state', 'Standby', 'd.fire_at_ms', ARGV[6], 'd.action', ARGV[8],
      'b.term', 1)
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  census(nil, 'Inexistent')
  redis.call('ZADD', KEYS[2], birth_ms, uuid .. ':birth')
  redis.call('ZADD', KEYS[3], 0, lives_member(ARGV[5], uuid))
  for i = first_plugin_key, #KEYS do redis.call('SADD', KEYS[i], uuid) end
  notify_if_soon(ARGV[5], ARGV[11])
  return {'ok'}
end

-- What the record REC of an `Idempotency-Key` says of a call with the request
-- fingerprint FP: nil when there is none; {'reused'} (another request's key),
-- {'replay', status, body}, {'in_progress'} (a call under way, begun less than
-- PENDING_MS ago), or {'stale'} (begun long ago, its answer never recorded: the host
-- making it died). Redis's clock is read only for a pending record.
local function idem_lookup(rec, fp, pending_ms)
  local r = redis.call('HMGET', rec, 'fp', 'state', 'status', 'body', 'at_ms')
  if not r[1] then return nil end
  if r[1] ~= fp then return {'reused'} end
  if r[2] == 'done' then return {'replay', r[3], r[4]} end
  if redis_now_ms() - tonumber(r[5] or 0) < tonumber(pending_ms) then return {'in_progress'} end
  return {'stale'}
end

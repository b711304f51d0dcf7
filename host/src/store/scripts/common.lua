-- Helpers shared by the scripts below; kairos prepends this file to each of them.
-- Every key is built from PREFIX (ARGV[1] of every script) so that one Redis can hold
-- several kairos installations side by side.

local PREFIX = ARGV[1]

local function plan_key(plan_id) return PREFIX .. 'plan:' .. plan_id end
local function life_key(uuid) return PREFIX .. 'life:' .. uuid end

-- The member of {prefix}:lives for a Life: zero-padded birth ms, ':', uuid, so that
-- ZRANGEBYLEX lists Lives by birth time and a member is an exact pagination cursor.
local function lives_member(birth_ms, uuid)
  local s = tostring(birth_ms)
  return string.rep('0', 13 - #s) .. s .. ':' .. uuid
end

-- Takes a Plan back from whichever host holds it in memory. The holder's timer entry
-- then fails the fencing check of start_run (state or claim number differ) and is
-- dropped, so a Plan moved by PATCH or DELETE never fires at its old time.
local function release_claim(pk, plan_id)
  local owner = redis.call('HGET', pk, 'lease_owner')
  if owner then
    redis.call('ZREM', PREFIX .. 'held:' .. owner, plan_id)
    redis.call('HDEL', pk, 'lease_owner')
  end
end

-- Marks a Life finished: it no longer blocks its resource and is swept after retention.
-- Extra field/value pairs (a run record) are written in the same HSET.
local function finish_life(lk, uuid, state, now_ms, ...)
  redis.call('HSET', lk, 'state', state, 'finished_at_ms', now_ms, 'updated_at_ms', now_ms, ...)
  redis.call('ZADD', PREFIX .. 'finished', now_ms, uuid)
end

-- Cancels a Plan that has not run (Standby or Preset); a Plan in any other state is left.
local function cancel_plan(plan_id)
  local pk = plan_key(plan_id)
  local state = redis.call('HGET', pk, 'state')
  if state == 'Standby' or state == 'Preset' then
    release_claim(pk, plan_id)
    redis.call('ZREM', PREFIX .. 'due', plan_id)
    redis.call('HSET', pk, 'state', 'Cancelled')
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

local function notify_if_soon(fire_ms, notify_before_ms)
  if tonumber(fire_ms) <= tonumber(notify_before_ms) then
    redis.call('PUBLISH', PREFIX .. 'notify', fire_ms)
  end
end

-- Puts a Plan this host holds (Preset or Running under HOST) back into the due set at its
-- own fire time; returns 1 if it moved, 0 if it was not held by HOST any more. A Running
-- Plan moves only if it started before RUNNING_BEFORE_MS (nil: any), so that a live
-- host's audit never takes away a run that has just begun. The caller removes moved
-- Plans from held:{host}.
local function hand_back(plan_id, host, notify_before_ms, running_before_ms)
  local pk = plan_key(plan_id)
  local f = redis.call('HMGET', pk, 'state', 'lease_owner', 'fire_at_ms', 'started_at_ms', 'claims')
  if f[1] == 'Running' and running_before_ms
      and tonumber(f[4] or 0) >= tonumber(running_before_ms) then
    return -1
  end
  if (f[1] == 'Preset' or f[1] == 'Running') and f[2] == host then
    if f[1] == 'Running' then
      redis.call('HSET', pk, 'state', 'Standby', 'last_error',
        'host ' .. host .. ' stopped while running this Plan; it runs again')
      -- A queue task's run no longer counts against its queue's max_concurrent.
      local queue = task_queue(plan_id)
      if queue then
        redis.call('SREM', PREFIX .. 'queue:' .. queue .. ':running', plan_id .. '#' .. f[5])
      end
    else
      redis.call('HSET', pk, 'state', 'Standby')
    end
    if task_queue(plan_id) then
      redis.call('ZADD', PREFIX .. 'due_tasks', f[3], plan_id)
    else
      redis.call('ZADD', PREFIX .. 'due', f[3], plan_id)
    end
    notify_if_soon(f[3], notify_before_ms)
    return 1
  end
  return 0
end

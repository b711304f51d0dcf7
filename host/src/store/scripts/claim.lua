#!lua flags=allow-oom
-- claim: the shard's owner moves up to LIMIT Plans due before UNTIL from the due set into
-- the shard's held set, marking them Preset under its host, and gets what it needs to
-- fire them. Only the owner of the shard's lease (host and generation, and the lease
-- not run out) may claim: a host that lost the shard claims nothing.
-- Queue tasks wait in their own set, due_tasks, and are claimed only when due before
-- TASKS_UNTIL (a second ahead, not the whole look-ahead window), at most TASK_LIMIT of
-- them: a task may still have to wait for its queue's tokens, and a backlog must wait in
-- Redis, not in memory, where it would take the room of other work.
-- Claim numbers come from one counter per shard (`claim_seq`) and are never used twice,
-- even for a Plan deleted and created again under the same id: a stale entry of an
-- earlier claim can never pass start_run's fence.
-- KEYS: 1 due, 2 held, 3 owner, 4 due_tasks, 5 claim_seq
-- ARGV: 1 prefix, 2 host, 3 gen, 4 until_ms, 5 limit, 6 tasks_until_ms, 7 task limit
-- Returns {'ok', rows, next task ms ('' = none)} with rows of {plan_id, fire_at_ms,
--   claim number, action JSON, attempts, resource_id, opts JSON ('' for Lives)}, or
--   {'lost', {}, ''} / {'expired', {}, ''}. The next task is the first one left in
--   due_tasks: the owner sleeps until it comes within TASKS_UNTIL's reach.
local host = ARGV[2]
local owned = ownership(host, ARGV[3])
if owned ~= 'ok' then return {owned, {}, ''} end
local out, held = {}, {}
local function take(set, until_ms, limit)
  if limit <= 0 then return end
  local items = redis.call('ZRANGEBYSCORE', set, '-inf', until_ms, 'WITHSCORES', 'LIMIT', 0, limit)
  if #items == 0 then return end
  local taken = {}
  local seq = redis.call('INCRBY', KEYS[5], #items / 2) - #items / 2
  for i = 1, #items, 2 do
    local id, fire_ms = items[i], items[i + 1]
    taken[#taken + 1] = id
    local pk, pn = plan_of(id)
    local f = redis.call('HMGET', pk, pn.state, pn.action, pn.attempts, pn.resource_id, pn.opts)
    -- A member whose Plan is gone or no longer Standby is stale: dropping it is the fix.
    if f[1] == 'Standby' then
      seq = seq + 1
      local claim = tostring(seq)
      redis.call('HSET', pk, pn.state, 'Preset', pn.lease_owner, host, pn.claims, claim)
      held[#held + 1] = fire_ms
      held[#held + 1] = id
      out[#out + 1] = {id, fire_ms, claim, f[2], f[3] or '0', f[4] or '', f[5] or ''}
    end
  end
  redis.call('ZREM', set, unpack(taken))
end
local limit = tonumber(ARGV[5])
take(KEYS[1], ARGV[4], limit)
take(KEYS[4], ARGV[6], math.min(limit - #out, tonumber(ARGV[7])))
if #held > 0 then redis.call('ZADD', KEYS[2], unpack(held)) end
local next_task = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
return {'ok', out, next_task[2] or ''}

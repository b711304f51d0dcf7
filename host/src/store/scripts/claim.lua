-- claim: moves up to LIMIT Plans due before UNTIL from the due set into this host's
-- held set, marking them Preset under this host's lease, and returns what the host needs
-- to fire them. Any number of hosts may run it at once: each Plan goes to one of them.
-- Queue tasks wait in their own set, due_tasks, and are claimed only when due before
-- TASKS_UNTIL (a second ahead, not the whole look-ahead window): a task may still have
-- to wait for its queue's tokens, and a backlog must wait in Redis, not in memory.
-- KEYS: 1 due, 2 held:{host}, 3 hosts, 4 due_tasks
-- ARGV: 1 prefix, 2 host, 3 until_ms, 4 limit, 5 heartbeat deadline ms, 6 tasks_until_ms
-- Returns a list of {plan_id, fire_at_ms, claim number, action JSON, attempts, resource_id,
--   opts JSON ('' for Lives: a timer's priority, retries and timeout)}
local host = ARGV[2]
redis.call('ZADD', KEYS[3], ARGV[5], host)
local out, held = {}, {}
local function take(set, until_ms, limit)
  if limit <= 0 then return end
  local items = redis.call('ZRANGEBYSCORE', set, '-inf', until_ms, 'WITHSCORES', 'LIMIT', 0, limit)
  if #items == 0 then return end
  local taken = {}
  for i = 1, #items, 2 do
    local id, fire_ms = items[i], items[i + 1]
    taken[#taken + 1] = id
    local pk = plan_key(id)
    local f = redis.call('HMGET', pk, 'state', 'action', 'attempts', 'resource_id', 'claims', 'opts')
    -- A member whose Plan is gone or no longer Standby is stale: dropping it is the fix.
    if f[1] == 'Standby' then
      local claim = tostring((tonumber(f[5]) or 0) + 1)
      redis.call('HSET', pk, 'state', 'Preset', 'lease_owner', host, 'claims', claim)
      held[#held + 1] = fire_ms
      held[#held + 1] = id
      out[#out + 1] = {id, fire_ms, claim, f[2], f[3] or '0', f[4] or '', f[6] or ''}
    end
  end
  redis.call('ZREM', set, unpack(taken))
end
local limit = tonumber(ARGV[4])
take(KEYS[1], ARGV[3], limit)
take(KEYS[4], ARGV[6], limit - #out)
if #held > 0 then redis.call('ZADD', KEYS[2], unpack(held)) end
return out

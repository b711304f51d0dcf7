#!lua flags=allow-oom
-- claim: the shard's owner takes up to LIMIT Plans due before UNTIL into its memory: a
-- Life's Plans off the due tree into `inflight` (`{claim}|{fire}|{host}`: Preset); a
-- timer's off `timers_due` into
-- `held` (its Plan hash Preset, as before). Only the owner of the shard's lease (host
-- and generation, and the lease not run out) may claim: a host that lost the shard
-- claims nothing.
-- Queue tasks wait in their own sets, the task_due tree (tasks never claimed, each a
-- record: task_add) and due_tasks (the others), and are claimed only when due before
-- TASKS_UNTIL (a second ahead, not the whole look-ahead window), at most TASK_LIMIT of
-- them: a task may still have to wait for its queue's tokens, and a backlog must wait in
-- Redis, not in memory, where it would take the room of other work.
-- Claim numbers come from one counter per shard (`claim_seq`) and are never used twice,
-- even for a Plan deleted and created again under the same id: a stale entry of an
-- earlier claim can never pass start_run's fence.
-- KEYS: 1 due (tree), 2 held, 3 owner, 4 due_tasks, 5 claim_seq, 6 timers_due, 7 inflight
-- ARGV: 1 prefix, 2 host, 3 gen, 4 until_ms, 5 limit, 6 tasks_until_ms, 7 task limit
-- A Life's record is not read here: the host reads it after the claim, with plain HGETs
-- from the buckets the returned bucket count names (Store::claim). A record carried
-- through the script cost Redis ~2 µs a Plan more than those reads (its SHA-1 bucket
-- lookup, and the whole record made a Lua string, which Redis's Lua hashes byte by
-- byte). A member whose Life is gone is claimed all the same: its host finds no
-- record, does not track it, and the audit hands it back (release.lua drops it then).
-- Returns {'ok', lives, rows, next task ms ('' = none), record buckets}: LIVES a flat
--   list of three values per Life's Plan, plan_id, fire_at_ms and claim number (a
--   nested row per Plan costs Redis twice as much to send), ROWS one row per timer's or
--   task's Plan, {plan_id, fire_at_ms, claim number, action, attempts, resource_id,
--   opts JSON}; or {'lost', {}, {}, '', 0} / {'expired', {}, {}, '', 0}. The next task
--   is the first one left in either: the owner sleeps until it comes within
--   TASKS_UNTIL's reach.
local host = ARGV[2]
local owned = ownership(host, ARGV[3])
if owned ~= 'ok' then return {owned, {}, {}, '', 0} end
local lives_out, out, held, inflight = {}, {}, {}, {}
local limit = tonumber(ARGV[5])
local seq = nil
local function next_claim()
  if not seq then seq = redis.call('INCRBY', KEYS[5], limit) - limit end
  seq = seq + 1
  return int_arg(seq)
end

-- A Life's Plans.
local lives = tree_take(KEYS[1], ARGV[4], limit)
local n_inflight, n_lives = 0, 0
local bar_host = '|' .. host
for i = 1, #lives, 2 do
  local id, fire_ms = lives[i], lives[i + 1]
  local claim = next_claim()
  inflight[n_inflight + 1] = id
  inflight[n_inflight + 2] = claim .. '|' .. fire_ms .. bar_host
  n_inflight = n_inflight + 2
  lives_out[n_lives + 1] = id
  lives_out[n_lives + 2] = fire_ms
  lives_out[n_lives + 3] = claim
  n_lives = n_lives + 3
end
if n_inflight > 0 then redis.call('HSET', KEYS[7], unpack(inflight)) end

-- Timers' and tasks' Plans, each a hash of its own.
local function take(set, until_ms, n)
  if n <= 0 then return end
  local items = redis.call('ZRANGEBYSCORE', set, '-inf', until_ms, 'WITHSCORES', 'LIMIT', '0', int_arg(n))
  if #items == 0 then return end
  for i = 1, #items, 2 do
    local id, fire_ms = items[i], items[i + 1]
    local pk = plan_key(id)
    local f = redis.call('HMGET', pk, 'state', 'action', 'attempts', 'resource_id', 'opts')
    if f[1] == 'Standby' then
      local claim = next_claim()
      redis.call('HSET', pk, 'state', 'Preset', 'lease_owner', host, 'claims', claim)
      held[#held + 1] = fire_ms
      held[#held + 1] = id
      out[#out + 1] = {id, fire_ms, claim, f[2], f[3] or '0', f[4] or '', f[5] or ''}
    end
  end
  -- The set's first members by rank, as read.
  redis.call('ZREMRANGEBYRANK', set, '0', int_arg(#items / 2 - 1))
end
-- Tasks added and never claimed: a record each (task_add), its Plan hash written here.
local function take_records(until_ms, n)
  if n <= 0 then return end
  local items = tree_take(task_due_key(), until_ms, n)
  for i = 1, #items, 2 do
    local id, fire_ms = items[i], items[i + 1]
    local fields = take_task_record(id)
    -- A member whose record is gone is stale: dropping it is the fix.
    if fields then
      local claim = next_claim()
      fields[2] = 'Preset'
      fields[#fields + 1] = 'lease_owner'
      fields[#fields + 1] = host
      fields[#fields + 1] = 'claims'
      fields[#fields + 1] = claim
      redis.call('HSET', plan_key(id), unpack(fields))
      held[#held + 1] = fire_ms
      held[#held + 1] = id
      out[#out + 1] = {id, fire_ms, claim, fields[8], '0', '', ''}
    end
  end
end
local lives_n = n_lives / 3
take(KEYS[6], ARGV[4], limit - lives_n - #out)
local task_limit = tonumber(ARGV[7])
local before = #out
take(KEYS[4], ARGV[6], math.min(limit - lives_n - #out, task_limit))
take_records(ARGV[6], math.min(limit - lives_n - #out, task_limit - (#out - before)))
if #held > 0 then redis.call('ZADD', KEYS[2], unpack(held)) end
local next_task = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
local next_record = tree_first(task_due_key())[2]
if next_record and (not next_task or tonumber(next_record) < tonumber(next_task)) then
  next_task = next_record
end
return {'ok', lives_out, out, next_task or '', n_lives > 0 and record_buckets() or 0}

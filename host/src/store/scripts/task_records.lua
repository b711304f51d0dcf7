-- Helpers for queue tasks kept as records; kairos prepends this, after common.lua (whose
-- buckets, trees and PREFIX it uses), to the scripts that name them.

-- Pending queue tasks (record format 4). A push task added and not yet claimed is one
-- compact JSON value, the field `{queue}/{task}` of one of the shard's task buckets
-- `t:{n}` (linear hashing as the Lives' buckets, counted by `tn`), waiting in the
-- `task_due` tree at its ETA: `{"f":ETA,"c":added at[,"x":expires at][,"k":its key],
-- "a":action}`, the action last and verbatim. The first claim of it, or any change
-- (task_change, queue_purge), turns it into the Plan hash every later step works on
-- (task_promote); a retry, a deferral or a run asked for again stays a hash.
local task_counts = {}
-- The last field's bucket, as record_key keeps it: adding a task looks and then writes.
local last_task_field, last_task_n, last_task_prefix, last_task_key, last_task_h =
  nil, nil, nil, nil, nil
local task_hashes = {}

local function task_bucket_key(field)
  local n = task_counts[PREFIX]
  if not n then
    n = tonumber(redis.call('GET', PREFIX .. 'tn')) or 1
    task_counts[PREFIX] = n
  end
  if field ~= last_task_field or n ~= last_task_n or PREFIX ~= last_task_prefix then
    -- Adding a list of tasks checks every name, then writes every task: each field's
    -- hash is worked out once a call (a SHA-1 in Lua costs more than the lookup).
    local h = task_hashes[field]
    if not h then
      h = id_hash(field)
      task_hashes[field] = h
    end
    last_task_field, last_task_n, last_task_prefix, last_task_h = field, n, PREFIX, h
    last_task_key = PREFIX .. 't:' .. int_arg(bucket_index(last_task_h, n))
  end
  return last_task_key
end

local function task_due_key() return PREFIX .. 'task_due' end

-- The bucket field of Plan `{queue}/{task}:task`.
local function task_field(plan_id) return string.sub(plan_id, 1, -6) end

-- Writes a new task's record and puts it in task_due. As a booking does
-- (booking_checks), only a quarter of adds, by two bits of the hash that place nothing,
-- look at the sizes of the bucket and of the tree leaf.
local function put_task_record(plan_id, eta_ms, now_ms, expires_ms, ck, action)
  -- One concatenation: each step of a longer one would make a string of its own.
  local rec = '{"f":' .. eta_ms .. ',"c":' .. now_ms
    .. (expires_ms ~= '' and ',"x":' .. expires_ms or '')
    .. (ck and ',"k":' .. cjson.encode(ck) or '') .. ',"a":' .. action .. '}'
  local field = task_field(plan_id)
  local key = task_bucket_key(field)
  local check = math.floor(last_task_h / 16777216) % 4 == 0
  if redis.call('HSET', key, field, rec) == 1 and check
      and redis.call('HLEN', key) > RECORDS_SPLIT_AT then
    split_buckets('t:', 'tn', task_counts, task_counts[PREFIX])
  end
  tree_add(task_due_key(), eta_ms, plan_id, check)
end

-- A pending task's record, or false.
local function get_task_record(plan_id)
  return redis.call('HGET', task_bucket_key(task_field(plan_id)), task_field(plan_id))
end

-- A task record's Plan hash fields, {field, value, ...}: Standby at its ETA, never run.
-- The scalars come before `"a":`, which no JSON string can hold unescaped (a string's
-- quotes are escaped), so the action is the rest, as it was given.
local function task_record_fields(rec)
  local at = string.find(rec, ',"a":', 1, true)
  local head = cjson.decode(string.sub(rec, 1, at - 1) .. '}')
  local fields = {'state', 'Standby', 'fire_at_ms', int_arg(head.f),
    'created_at_ms', int_arg(head.c), 'action', string.sub(rec, at + 5, -2)}
  if head.x then
    fields[#fields + 1] = 'expires_at_ms'
    fields[#fields + 1] = int_arg(head.x)
  end
  if head.k then
    fields[#fields + 1] = 'ck'
    fields[#fields + 1] = head.k
  end
  return fields, head.f
end

-- Takes a pending task's record out of its bucket: its Plan hash fields and its ETA
-- (task_record_fields), or nil when it has none. The caller writes the hash.
local function take_task_record(plan_id)
  local rec = get_task_record(plan_id)
  if not rec then return nil end
  redis.call('HDEL', task_bucket_key(task_field(plan_id)), task_field(plan_id))
  return task_record_fields(rec)
end

-- Turns a pending task's record into its Plan hash, Standby in `due_tasks` at its ETA
-- (the shape a task has once it ran or changed), so that what follows reads and writes
-- the hash alone. A task that is a hash already, or none at all, is left as it is.
local function task_promote(plan_id)
  local fields, eta = take_task_record(plan_id)
  if not fields then return end
  tree_rem(task_due_key(), eta, plan_id)
  redis.call('HSET', plan_key(plan_id), unpack(fields))
  redis.call('ZADD', PREFIX .. 'due_tasks', int_arg(eta), plan_id)
end

-- Whether a task's name is taken: the task exists, either way it is stored, or its
-- tombstone (`tombstone:{queue}/{task}`) has not expired.
local function task_name_taken(plan_id)
  local field = task_field(plan_id)
  return redis.call('EXISTS', plan_key(plan_id), PREFIX .. 'tombstone:' .. field) > 0
    or redis.call('HEXISTS', task_bucket_key(field), field) == 1
end

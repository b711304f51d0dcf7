-- migrate: moves one object of a keyspace written before shards (layout 1: every key
-- under OLD, `{key_prefix}:`) into its shard (PREFIX), or folds the Plans of one Life of
-- a sharded keyspace of layout 2 (`plan:{uuid}:{kind}` hashes of their own) into its
-- Life's hash (layout 3, plan_of in common.lua). `kairos migrate` runs it with every host
-- stopped; each call moves one object whole, so a migration cut off anywhere is resumed
-- by running it again. A Plan a host of the old version still held (a host killed
-- before it could hand back) goes back to its due set on the way, a run it had under way
-- recorded as interrupted, as a takeover would.
-- ARGV: 1 shard prefix, 2 old prefix, 3 mode ('life' | 'timer' | 'queue' | 'task' |
--       'tombstone' | 'fold'), 4 name (a Life id, a timer or queue name,
--       `{queue}/{task}`), then for 'life': 5 the home shard's prefix when the Life's
--       resource puts it in another shard ('' otherwise), 6 the pointer's value
-- Returns 1 when it moved something, 0 when there was nothing left to move.
local OLD, mode, name = ARGV[2], ARGV[3], ARGV[4]

local function move(from, to)
  if redis.call('EXISTS', from) == 1 then
    redis.call('RENAME', from, to)
    return true
  end
  return false
end

-- Moves an index entry (a sorted set member) from the old key to the new one.
local function move_member(old_key, new_key, member, default_score)
  local score = redis.call('ZSCORE', old_key, member)
  redis.call('ZREM', old_key, member)
  if score or default_score then redis.call('ZADD', new_key, score or default_score, member) end
end

-- A Plan just moved: out of the old due set (into the new one if it waited there), and
-- handed back if a host of the old version held it.
local function settle(plan_id, due)
  local pk, pn = plan_of(plan_id)
  local f = redis.call('HMGET', pk, pn.state, pn.lease_owner)
  if f[2] then redis.call('ZREM', OLD .. 'held:' .. f[2], plan_id) end
  move_member(OLD .. due, PREFIX .. due, plan_id, nil)
  if f[1] == 'Preset' or f[1] == 'Running' then
    redis.call('ZREM', PREFIX .. due, plan_id)
    hand_back(plan_id, 0, nil, nil)
  end
end

-- Moves the Plan hash FROM of a Life's Plan PLAN_ID into the fields of its Life (which
-- must be in place); false when there was none.
local function fold(from, plan_id)
  local fields = redis.call('HGETALL', from)
  if #fields == 0 then return false end
  local pk, pn = plan_of(plan_id)
  local out = {}
  for i = 1, #fields, 2 do
    -- The Life's own resource_id stands for its Plans'.
    if fields[i] ~= 'resource_id' then
      out[#out + 1] = pn[fields[i]]
      out[#out + 1] = fields[i + 1]
    end
  end
  if #out > 0 then redis.call('HSET', pk, unpack(out)) end
  redis.call('DEL', from)
  return true
end

if mode == 'fold' then
  if redis.call('EXISTS', life_key(name)) == 0 then
    -- Plans left without their Life: nothing to fold them into.
    redis.call('DEL', PREFIX .. 'plan:' .. name .. ':birth', PREFIX .. 'plan:' .. name .. ':death')
    return 0
  end
  local moved = 0
  for _, kind in ipairs({'birth', 'death'}) do
    if fold(PREFIX .. 'plan:' .. name .. ':' .. kind, name .. ':' .. kind) then moved = 1 end
  end
  return moved
elseif mode == 'life' then
  local uuid = name
  local old_life = OLD .. 'life:' .. uuid
  if redis.call('EXISTS', old_life) == 0 then return 0 end
  local f = redis.call('HMGET', old_life, 'birth_at_ms', 'resource_id', 'state')
  redis.call('RENAME', old_life, life_key(uuid))
  census(nil, f[3])
  local member = lives_member(f[1] or 0, uuid)
  redis.call('ZREM', OLD .. 'lives', member)
  redis.call('ZADD', PREFIX .. 'lives', 0, member)
  move_member(OLD .. 'finished', PREFIX .. 'finished', uuid, nil)
  for _, kind in ipairs({'birth', 'death'}) do
    local id = uuid .. ':' .. kind
    if fold(OLD .. 'plan:' .. id, id) then
      settle(id, 'due')
      local pk, pn = plan_of(id)
      local ok, action = pcall(cjson.decode, redis.call('HGET', pk, pn.action) or '')
      if ok and type(action) == 'table' and type(action.plugin) == 'string' then
        local plugin = string.match(action.plugin, '^[^@]+')
        redis.call('SREM', OLD .. 'plugin:' .. plugin .. ':lives', uuid)
        redis.call('SADD', PREFIX .. 'plugin-lives:' .. plugin, uuid)
      end
    end
  end
  local rid = f[2]
  if rid then
    move_member(OLD .. 'resource:' .. rid, PREFIX .. 'resource:' .. rid, uuid, f[1] or 0)
    -- The order set is rebuilt from the Plans (a keyspace older than order sets has
    -- none): every unfinished Plan of the resource, by its time.
    redis.call('ZREM', OLD .. 'order:' .. rid, uuid .. ':birth', uuid .. ':death')
    for _, kind in ipairs({'birth', 'death'}) do
      local pk, pn = plan_of(uuid .. ':' .. kind)
      local p = redis.call('HMGET', pk, pn.state, pn.fire_at_ms)
      if p[1] == 'Standby' or p[1] == 'Preset' or p[1] == 'Running' then
        redis.call('ZADD', order_key(rid), p[2], uuid .. ':' .. kind)
      end
    end
  end
  if ARGV[5] ~= '' then redis.call('SET', ARGV[5] .. 'ptr:' .. uuid, ARGV[6]) end
  return 1
elseif mode == 'timer' then
  local moved = move(OLD .. 'timer:' .. name, PREFIX .. 'timer:' .. name)
  move_member(OLD .. 'timers', PREFIX .. 'timers', name, moved and 0 or nil)
  if not moved then return 0 end
  move(OLD .. 'timer:' .. name .. ':runs', PREFIX .. 'timer:' .. name .. ':runs')
  local id = name .. ':timer'
  if move(OLD .. 'plan:' .. id, plan_key(id)) then settle(id, 'due') end
  return 1
elseif mode == 'queue' then
  local moved = move(OLD .. 'queue:' .. name, PREFIX .. 'queue:' .. name)
  move_member(OLD .. 'queues', PREFIX .. 'queues', name, moved and 0 or nil)
  if not moved then return 0 end
  for _, suffix in ipairs({':tasks', ':failed', ':running', ':waiting', ':leased'}) do
    move(OLD .. 'queue:' .. name .. suffix, PREFIX .. 'queue:' .. name .. suffix)
  end
  return 1
elseif mode == 'task' then
  local id = name .. ':task'
  if not move(OLD .. 'plan:' .. id, plan_key(id)) then
    redis.call('ZREM', OLD .. 'due_tasks', id)
    return 0
  end
  settle(id, 'due_tasks')
  return 1
elseif mode == 'tombstone' then
  -- RENAME keeps the time to live.
  if move(OLD .. 'tombstone:' .. name, PREFIX .. 'tombstone:' .. name) then return 1 end
  return 0
end
return redis.error_reply('unknown mode ' .. tostring(mode))

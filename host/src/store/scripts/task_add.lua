-- task_add: adds up to 100 tasks to a queue, all or none. A task is a Plan
-- `{queue}/{task}:task`, a compact record in a task bucket waiting in the task_due tree
-- (claimed like the due set, see claim; task_records.lua); its name is refused
-- while the task exists or its tombstone (left when it finished or was deleted) has not
-- expired.
-- The `default` queue is created with DEFAULTS the first time it is used.
-- KEYS: 1 queue, 2 queue tasks index, 3 due_tasks, 4 queues index
-- ARGV: 1 prefix, 2 queue, 3 now_ms, 4 now_rfc, 5 notify_before_ms,
--       6 defaults of the default queue (JSON object of field -> value),
--       then per task 6 values: name, eta_ms, action JSON ('' for a pull task),
--       expires_at_ms ('' = never: see start_run), payload JSON ('' for a push task), tag
-- Times are kept in ms only (the API renders them); `attempts` appears with the first run.
-- A push queue's tasks go to task_due for the hosts to run; a pull queue's (marked
-- `pull`, with their payload) wait in the queue's tasks index only, for task_lease.
-- Returns {'ok'} | {'missing'} | {'duplicate', name} | {'mode', the queue's mode} when
--   a task does not fit the queue's mode
local queue = ARGV[2]
if redis.call('EXISTS', KEYS[1]) == 0 then
  if queue ~= 'default' then return {'missing'} end
  local fields = {'state', 'running', 'created_at', ARGV[4]}
  for k, v in pairs(cjson.decode(ARGV[6])) do
    fields[#fields + 1] = k
    fields[#fields + 1] = tostring(v)
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('ZADD', KEYS[4], 0, queue)
end
for i = 7, #ARGV, 6 do
  local id = queue .. '/' .. ARGV[i]
  if task_name_taken(id .. ':task') then
    return {'duplicate', ARGV[i]}
  end
end
local pull = redis.call('HGET', KEYS[1], 'mode') == 'pull'
-- A queue with per-key limits names where a task's key is (`key`): a JSON pointer into
-- the action's body (a webhook's `body`, a plugin's `input`), or `header:NAME` for a
-- webhook header. The value found (a string, number or boolean; longer than 200 bytes:
-- its SHA-1) is stored as the task's `ck`; a task without one is limited by the queue
-- alone.
local key_path = redis.call('HGET', KEYS[1], 'key') or ''
local function task_key(action_json)
  if key_path == '' or action_json == '' then return nil end
  local ok, action = pcall(cjson.decode, action_json)
  if not ok or type(action) ~= 'table' then return nil end
  local v
  local header = string.match(key_path, '^header:(.+)$')
  if header then
    header = string.lower(header)
    for name, value in pairs(type(action.headers) == 'table' and action.headers or {}) do
      if string.lower(name) == header then v = value end
    end
  else
    v = action.body
    if v == nil then v = action.input end
    for part in string.gmatch(string.sub(key_path, 2) .. '/', '([^/]*)/') do
      if type(v) ~= 'table' then return nil end
      part = string.gsub(string.gsub(part, '~1', '/'), '~0', '~')
      local index = tonumber(part)
      if v[part] ~= nil then v = v[part]
      elseif index then v = v[index + 1]
      else return nil end
    end
  end
  local t = type(v)
  if t == 'number' then
    if v == math.floor(v) and math.abs(v) < 1e15 then v = string.format('%d', v) else v = tostring(v) end
  elseif t == 'boolean' then v = tostring(v)
  elseif t ~= 'string' then return nil end
  if #v > 200 then return redis.sha1hex(v) end
  return v
end
for i = 7, #ARGV, 6 do
  if pull ~= (ARGV[i + 4] ~= '') then
    if pull then return {'mode', 'pull'} end
    return {'mode', 'push'}
  end
end
local min_eta
for i = 7, #ARGV, 6 do
  local name, eta_ms = ARGV[i], ARGV[i + 1]
  local plan_id = queue .. '/' .. name .. ':task'
  redis.call('ZADD', KEYS[2], eta_ms, name)
  if pull then
    local fields = {'state', 'Standby', 'fire_at_ms', eta_ms, 'created_at_ms', ARGV[3],
      'pull', '1', 'payload', ARGV[i + 4]}
    if ARGV[i + 5] ~= '' then
      fields[#fields + 1] = 'tag'
      fields[#fields + 1] = ARGV[i + 5]
    end
    redis.call('HSET', plan_key(plan_id), unpack(fields))
  else
    -- A push task waits as a compact record until it is claimed (task_promote).
    put_task_record(plan_id, eta_ms, ARGV[3], ARGV[i + 3], task_key(ARGV[i + 2]), ARGV[i + 2])
    if not min_eta or tonumber(eta_ms) < min_eta then min_eta = tonumber(eta_ms) end
  end
end
if min_eta then notify_if_soon(min_eta, ARGV[5]) end
return {'ok'}

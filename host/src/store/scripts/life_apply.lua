#!lua flags=allow-oom
-- life_apply: changes one Life: its record and the index entries that go with it, all or
-- nothing, and only if the Life is as the host read it (its record's text, and each
-- Plan's `inflight` entry). The host decided the change (store/record/: a PATCH, a
-- DELETE, a debounce merging into the Life, a run handed back after its host died) and
-- lists the index changes as operations:
--   due+ PLAN MS | due- PLAN MS      the Plan enters or leaves the due tree
--   infl- PLAN                       a Preset Plan is taken back from its host
--   lives+ MS | lives- MS            the Life in the lives tree at its birth time
--   fin+ MS                          the Life onto the finished list, finished at MS
--   order+ RID PLAN MS | order- RID PLAN   the resource's order set
--   res+ RID MS | res- RID           the resource's index
--   census FROM TO                   the census ('-' = none)
--   plugin+ NAME                     the plugin's set of Lives
--   conflict RID LO HI               refuse if another Life on RID meets [LO, HI]
--   touch                            its record changed while a Plan of it runs
--   runs PLAN OUTCOME RECORD         a run into the runs stream
-- A new record '' deletes the Life's record.
-- KEYS: 1 due (tree), 2 lives (tree), 3 finished (list), 4 inflight, 5 runs
-- ARGV: 1 prefix, 2 uuid, 3 the record as read ('' = none), 4 the new record, 5 now_ms,
--       6 notify_before_ms, 7 runs stream max length, 8 and 9 the birth's and death's
--       inflight entries as read ('-' = not checked, '' = none), then the operations
-- Returns {'ok'} | {'changed'} | {'resource_conflict', other}
local uuid = ARGV[2]
local current = get_record(uuid) or ''
if current ~= ARGV[3] then return {'changed'} end
local inflight = redis.call('HMGET', KEYS[4], uuid .. ':birth', uuid .. ':death')
for i, plan in ipairs({ARGV[8], ARGV[9]}) do
  if plan ~= '-' and (inflight[i] or '') ~= plan then return {'changed'} end
end
local ops = {}
local i = 10
local arity = {['due+'] = 2, ['due-'] = 2, ['infl-'] = 1, ['lives+'] = 1, ['lives-'] = 1,
  ['fin+'] = 1, ['order+'] = 3, ['order-'] = 2, ['res+'] = 2, ['res-'] = 1, census = 2,
  ['plugin+'] = 1, conflict = 3, touch = 0, runs = 3}
while i <= #ARGV do
  local op = ARGV[i]
  local n = arity[op]
  if not n then return redis.error_reply('life_apply: unknown operation ' .. op) end
  ops[#ops + 1] = {op, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]}
  i = i + 1 + n
end
-- Refusals first: nothing is written unless everything can be.
for _, o in ipairs(ops) do
  if o[1] == 'conflict' then
    local other = resource_conflict(PREFIX .. 'resource:' .. o[2], tonumber(o[3]), tonumber(o[4]), uuid)
    if other then return {'resource_conflict', other} end
  end
end
if ARGV[4] == '' then
  if current ~= '' then
    del_record(uuid)
    redis.call('ZREM', PREFIX .. 'failed', uuid)
  end
else
  put_record(uuid, ARGV[4])
end
for _, o in ipairs(ops) do
  local op = o[1]
  if op == 'due+' then
    tree_add(KEYS[1], o[3], o[2])
    notify_if_soon(o[3], ARGV[6])
  elseif op == 'due-' then
    tree_rem(KEYS[1], o[3], o[2])
  elseif op == 'infl-' then
    redis.call('HDEL', KEYS[4], o[2])
  elseif op == 'lives+' then
    tree_add(KEYS[2], o[2], uuid)
  elseif op == 'lives-' then
    tree_rem(KEYS[2], o[2], uuid)
  elseif op == 'fin+' then
    redis.call('RPUSH', KEYS[3], finished_entry(o[2], uuid))
  elseif op == 'order+' then
    redis.call('ZADD', order_key(o[2]), o[4], o[3])
  elseif op == 'order-' then
    redis.call('ZREM', order_key(o[2]), o[3])
  elseif op == 'res+' then
    redis.call('ZADD', PREFIX .. 'resource:' .. o[2], o[3], uuid)
  elseif op == 'res-' then
    redis.call('ZREM', PREFIX .. 'resource:' .. o[2], uuid)
  elseif op == 'census' then
    census(o[2] ~= '-' and o[2] or nil, o[3] ~= '-' and o[3] or nil)
  elseif op == 'plugin+' then
    redis.call('SADD', PREFIX .. 'plugin-lives:' .. o[2], uuid)
  elseif op == 'touch' then
    redis.call('SADD', PREFIX .. 'touched', uuid)
  elseif op == 'runs' then
    add_run(KEYS[5], ARGV[7], 'life', uuid, 'plan', o[2], 'outcome', o[3], 'record', o[4])
  end
end
return {'ok'}

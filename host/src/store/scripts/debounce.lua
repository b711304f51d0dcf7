-- debounce: books a point Life under a debounce key (Inngest's and Trigger.dev's
-- debounce). While the Life of the key's open window has not started (Inexistent, its
-- birth Standby or Preset, not cancelled), the booking takes its place: the pending
-- Life gets this booking's action and fires at now + period, but never past the cap
-- (its first booking + max_wait); a Preset birth is taken back from its host as PATCH
-- does. Otherwise this booking's Life is booked as new and opens the window. The
-- record, the Lives and their Plans are in the key's shard.
-- The host read the key's record and its Life first, decided, and built both records
-- (store/record/); if either changed meanwhile, 'retry': it reads them again.
-- KEYS: 1 debounce record, 2 due (tree), 3 lives (tree), 4 inflight,
--       5.. the `plugin-lives:{name}` sets of the plugins the action uses
-- ARGV: 1 prefix, 2 new uuid, 3 birth_ms (now + period), 4 the new Life's record,
--       5 cap_ms (now + max_wait), 6 now_ms, 7 notify_before_ms, 8 debounce key,
--       9 record expiry ms (past the cap), 10 the window's Life as read ('' = none),
--       11 merge into it ('1' / '0'), 12 its record as read, 13 its birth's inflight
--       entry as read, 14 its merged record, 15 its birth's new time, 16 its birth's
--       time as read
-- Returns {'debounced', uuid, fire_ms} | {'booked'} | {'duplicate'} | {'retry'}
local seen = redis.call('HGET', KEYS[1], 'life') or ''
if seen ~= ARGV[10] then return {'retry'} end
if ARGV[11] == '1' then
  local uuid, plan_id = ARGV[10], ARGV[10] .. ':birth'
  if (get_record(uuid) or '') ~= ARGV[12] then return {'retry'} end
  local entry = redis.call('HGET', KEYS[4], plan_id) or ''
  if entry ~= ARGV[13] then return {'retry'} end
  put_record(uuid, ARGV[14])
  if entry ~= '' then
    redis.call('HDEL', KEYS[4], plan_id)
  else
    tree_rem(KEYS[2], ARGV[16], plan_id)
  end
  tree_add(KEYS[2], ARGV[15], plan_id)
  tree_rem(KEYS[3], ARGV[16], uuid)
  tree_add(KEYS[3], ARGV[15], uuid)
  for i = 5, #KEYS do redis.call('SADD', KEYS[i], uuid) end
  notify_if_soon(ARGV[15], ARGV[7])
  return {'debounced', uuid, ARGV[15]}
end
local uuid = ARGV[2]
if get_record(uuid) then return {'duplicate'} end
put_record(uuid, ARGV[4])
census(nil, 'Inexistent')
tree_add(KEYS[2], ARGV[3], uuid .. ':birth')
tree_add(KEYS[3], ARGV[3], uuid)
for i = 5, #KEYS do redis.call('SADD', KEYS[i], uuid) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'life', uuid, 'cap_ms', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[9])
notify_if_soon(ARGV[3], ARGV[7])
return {'booked'}

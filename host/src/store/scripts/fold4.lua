#!lua flags=allow-oom
-- fold4: `kairos migrate` from layout 3 (a hash per Life, `life:{uuid}`, and the plain
-- sorted sets `due`, `lives`, `finished`) to layout 4 (records, trees), one shard at a
-- time, with every host stopped (store/migrate4.rs). Each call is whole, so a migration
-- cut off anywhere is finished by running it again:
-- - 'begin' sets the shard's layout-3 indexes aside once, as `due3`, `lives3` and
--   `finished3` (the key `fold4` says it was done: 'begun', then 'done');
-- - 'life' writes one Life's record, which the host built from its hash, puts it in the
--   trees (its Plans due where `due3` had them, and those a host of the old version
--   still held at the times given), and deletes the hash and its old index entries;
-- - 'end' moves what is left in `due3`, timers' Plans, to `timers_due` a batch at a
--   time; once none is left it drops the set-aside keys: answers 1 when done, 0 while
--   more is left.
-- KEYS: 1 the shard's `fold4` marker
-- ARGV: 1 prefix, 2 mode; for 'life': 3 uuid, 4 record ('' = none: the hash was
--   unreadable, only its entries go), 5 birth ms, 6 finish ms ('' = unfinished; `{ms}|F`:
--   finished as a failure, into the `failed` index too), 7 the
--   Life's member of `lives3`, then plan id and due ms pairs of Plans handed back;
--   for 'end': 3 batch
local mode = ARGV[2]
local marker = KEYS[1]
if mode == 'begin' then
  if not redis.call('GET', marker) then
    for _, name in ipairs({'due', 'lives', 'finished'}) do
      if redis.call('EXISTS', PREFIX .. name) == 1 then
        redis.call('RENAME', PREFIX .. name, PREFIX .. name .. '3')
      end
    end
    redis.call('SET', marker, 'begun')
  end
  return 1
elseif mode == 'life' then
  local uuid = ARGV[3]
  local due3 = PREFIX .. 'due3'
  local plans = {uuid .. ':birth', uuid .. ':death'}
  if ARGV[4] ~= '' and not get_record(uuid) then
    put_record(uuid, ARGV[4])
    tree_add(PREFIX .. 'lives', ARGV[5], uuid)
    local fin_ms, failed = string.match(ARGV[6], '^(%d+)(|?F?)$')
    if fin_ms then
      redis.call('RPUSH', PREFIX .. 'finished', finished_entry(fin_ms, uuid))
      if failed == '|F' then redis.call('ZADD', PREFIX .. 'failed', fin_ms, uuid) end
    end
    for _, id in ipairs(plans) do
      local score = redis.call('ZSCORE', due3, id)
      if score then tree_add(PREFIX .. 'due', score, id) end
    end
    for i = 8, #ARGV, 2 do tree_add(PREFIX .. 'due', ARGV[i + 1], ARGV[i]) end
  end
  redis.call('ZREM', due3, unpack(plans))
  redis.call('ZREM', PREFIX .. 'held', unpack(plans))
  redis.call('ZREM', PREFIX .. 'lives3', ARGV[7])
  redis.call('ZREM', PREFIX .. 'finished3', uuid)
  redis.call('DEL', PREFIX .. 'life:' .. uuid)
  return 1
elseif mode == 'end' then
  local due3 = PREFIX .. 'due3'
  local items = redis.call('ZRANGE', due3, 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
  local gone = {}
  for i = 1, #items, 2 do
    if string.sub(items[i], -6) == ':timer' then
      redis.call('ZADD', PREFIX .. 'timers_due', items[i + 1], items[i])
    end
    gone[#gone + 1] = items[i]
  end
  if #gone > 0 then
    redis.call('ZREM', due3, unpack(gone))
    return 0
  end
  redis.call('DEL', PREFIX .. 'lives3', PREFIX .. 'finished3')
  redis.call('SET', marker, 'done')
  return 1
end
return redis.error_reply('fold4: unknown mode ' .. tostring(mode))

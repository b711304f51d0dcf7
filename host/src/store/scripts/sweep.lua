#!lua flags=allow-oom
-- sweep: deletes Lives finished before CUTOFF (their Plans and history are in their
-- record) with their index entries (the `failed` index too), from the head of the `finished` list, and trims the
-- runs stream to the same retention. The list is in finishing order as far as the
-- hosts' clocks agree: the sweep stops at the first entry not old enough, so that it
-- never deletes a Life early.
-- KEYS: 1 finished (list), 2 lives (tree), 3 runs
-- ARGV: 1 prefix, 2 cutoff ms, 3 batch
-- Returns the ids of the Lives deleted (their pointers, if any, are in other shards).
local cutoff = tonumber(ARGV[2])
local entries = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)
local ids = {}
for _, entry in ipairs(entries) do
  if tonumber(string.sub(entry, 1, 13)) > cutoff then break end
  local uuid = string.sub(entry, 15)
  local rec = get_record(uuid)
  if rec then
    local h = record_head(rec)
    census(h.state, nil)
    tree_rem(KEYS[2], h.birth_ms, uuid)
    if h.resource_id then
      redis.call('ZREM', PREFIX .. 'resource:' .. h.resource_id, uuid)
      redis.call('ZREM', order_key(h.resource_id), uuid .. ':birth', uuid .. ':death')
    end
    del_record(uuid)
    redis.call('ZREM', PREFIX .. 'failed', uuid)
  end
  ids[#ids + 1] = uuid
end
if #ids > 0 then redis.call('LTRIM', KEYS[1], #ids, -1) end
redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[2])
return ids

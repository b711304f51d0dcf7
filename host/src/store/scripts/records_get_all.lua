-- records_get_all: records_get for Lives of many shards of a standalone Redis in one
-- call (a page of the listing). Not for a Redis Cluster: there it is one records_get
-- per shard.
-- KEYS: each shard's inflight
-- ARGV: 1 the first shard's prefix, then per shard (in the order of KEYS): its prefix, how
--       many ids, the ids
-- Returns per id, in order: {record or '', birth's entry or '', death's entry or ''}.
local out = {}
local a = 2
for s = 1, #KEYS do
  enter_shard(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  for i = a + 2, a + 1 + n do
    local uuid = ARGV[i]
    local f = redis.call('HMGET', KEYS[s], uuid .. ':birth', uuid .. ':death')
    out[#out + 1] = {get_record(uuid) or '', f[1] or '', f[2] or ''}
  end
  a = a + 2 + n
end
return out

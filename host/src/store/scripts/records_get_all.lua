-- records_get_all: records_get for Lives of many shards of a standalone Redis in one
-- call (a page of the listing). Not for a Redis Cluster: there it is one records_get
-- per shard.
-- ARGV: 1 '' (no one shard's: each shard's prefix comes before its ids), then per shard:
--       its prefix, how many ids, the ids
-- Returns per id, in order: its record, or '' when it is not there.
local out = {}
local a = 2
while a <= #ARGV do
  enter_shard(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  for i = a + 2, a + 1 + n do
    out[#out + 1] = get_record(ARGV[i]) or ''
  end
  a = a + 2 + n
end
return out

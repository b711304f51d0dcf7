-- lives_pages: lives_page for every shard of a standalone Redis in one call (a pass of
-- the listing), per shard {uuid, birth_ms, ...}. Not for a Redis Cluster, whose shards
-- lie in other slots: there the listing calls lives_page once per shard.
-- KEYS: each shard's lives tree
-- ARGV: 1 the first shard's prefix, 2 from ms, 3 after (a uuid, or ''), 4 to ms or '+inf',
--       5 limit per shard, 6 'asc' | 'desc' (as lives_page)
local limit = tonumber(ARGV[5])
local out = {}
for i = 1, #KEYS do
  if ARGV[6] == 'desc' then
    out[i] = tree_rev_range(KEYS[i], ARGV[4], ARGV[3], ARGV[2], limit)
  else
    out[i] = tree_range(KEYS[i], ARGV[2], ARGV[3], ARGV[4], limit)
  end
end
return out

-- lives_page: up to LIMIT Lives of the shard by birth time, {uuid, birth_ms, ...} (the
-- listing merges the shards' pages).
-- Oldest first ('asc'): from (FROM, AFTER) exclusive (AFTER '' = every Life at FROM) up
-- to birth TO. Newest first ('desc'): from (TO, AFTER) exclusive (AFTER '' = every Life
-- at TO) down to birth FROM.
-- KEYS: 1 lives (tree)
-- ARGV: 1 prefix, 2 from ms, 3 after (a uuid, or ''), 4 to ms or '+inf', 5 limit,
--       6 'asc' | 'desc'

local limit = tonumber(ARGV[5])
if ARGV[6] == 'desc' then
  return tree_rev_range(KEYS[1], ARGV[4], ARGV[3], ARGV[2], limit)
end
return tree_range(KEYS[1], ARGV[2], ARGV[3], ARGV[4], limit)

-- lives_page: up to LIMIT Lives of the shard by birth time, from (FROM, AFTER) exclusive
-- to TO: {uuid, birth_ms, ...} (the listing merges the shards' pages).
-- KEYS: 1 lives (tree)
-- ARGV: 1 prefix, 2 from ms, 3 after (a uuid; '' = every Life at FROM), 4 to ms or
--       '+inf', 5 limit
return tree_range(KEYS[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]))

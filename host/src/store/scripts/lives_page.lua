-- lives_page: up to LIMIT Lives of the shard by birth time, {uuid, birth_ms, ...} (the
-- listing merges the shards' pages).
-- Oldest first ('asc'): from (FROM, AFTER) exclusive (AFTER '' = every Life at FROM) up
-- to birth TO. Newest first ('desc'): from (TO, AFTER) exclusive (AFTER '' = every Life
-- at TO) down to birth FROM.
-- KEYS: 1 lives (tree)
-- ARGV: 1 prefix, 2 from ms, 3 after (a uuid, or ''), 4 to ms or '+inf', 5 limit,
--       6 'asc' | 'desc'

-- Up to LIMIT {member, score, ...} of TREE below (MAX, BEFORE) (exclusive; BEFORE '' for
-- every member at MAX; MAX '+inf' for the last) down to score MIN, in descending
-- (score, member) order: the leaves from the one that holds the start, backwards.
local function tree_rev_range(tree, max, before, min, limit)
  local out = {}
  if limit <= 0 then return out end
  local entry
  if max == '+inf' then
    entry = redis.call('ZRANGE', tree, -1, -1)[1]
  elseif before == '' then
    -- The leaf of the first member past every one at MAX.
    entry = tree_entry(tree, tonumber(max) + 1, '')
  else
    entry = tree_entry(tree, max, before)
  end
  local lo = tonumber(min)
  while entry do
    local leaf = tree .. ':' .. leaf_id_of(entry)
    local offset = 0
    while true do
      local want = limit - #out / 2 + 1
      local items = redis.call('ZREVRANGEBYSCORE', leaf, max, min, 'WITHSCORES',
        'LIMIT', offset, want)
      for i = 1, #items, 2 do
        local skip = before ~= '' and tonumber(items[i + 1]) == tonumber(max)
          and bytes_le(before, items[i])
        if not skip then
          out[#out + 1] = items[i]
          out[#out + 1] = items[i + 1]
          if #out / 2 >= limit then return out end
        end
      end
      if #items / 2 < want then break end
      offset = offset + #items / 2
    end
    -- Every leaf before this one holds members below this one's first.
    if tonumber(string.sub(entry, 1, 13)) < lo then return out end
    entry = redis.call('ZREVRANGEBYLEX', tree, '(' .. entry, '-', 'LIMIT', 0, 1)[1]
  end
  return out
end

local limit = tonumber(ARGV[5])
if ARGV[6] == 'desc' then
  return tree_rev_range(KEYS[1], ARGV[4], ARGV[3], ARGV[2], limit)
end
return tree_range(KEYS[1], ARGV[2], ARGV[3], ARGV[4], limit)

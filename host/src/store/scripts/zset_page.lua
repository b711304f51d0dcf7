-- zset_page: a page of a plain sorted set (a queue's tasks by ETA, its failed list by
-- failure time) past a position, in (score, member) order or its reverse, and the set's
-- size: {size, {member, score, ...}}. The position is the last member a page gave, with
-- its score: while that member is still there with that score the page goes on from its
-- rank; else (it ran, was deleted or moved) from its score, skipping the members at that
-- score that sort before it (after it, going down).
-- KEYS: 1 the set
-- ARGV: 1 prefix, 2 the position's score ('' = from the start), 3 its member, 4 limit,
--       5 'asc' | 'desc'
local key, limit, desc = KEYS[1], tonumber(ARGV[4]), ARGV[5] == 'desc'
local size = redis.call('ZCARD', key)
local function by_rank(first)
  local cmd = desc and 'ZREVRANGE' or 'ZRANGE'
  return redis.call(cmd, key, first, first + limit - 1, 'WITHSCORES')
end
if ARGV[2] == '' then return {size, by_rank(0)} end
local at, member = tonumber(ARGV[2]), ARGV[3]
local score = redis.call('ZSCORE', key, member)
if score and tonumber(score) == at then
  local rank = redis.call(desc and 'ZREVRANK' or 'ZRANK', key, member)
  return {size, by_rank(rank + 1)}
end
local out, offset = {}, 0
-- Bounded: each pass reads 200 more; ties at one score are what it may have to skip.
for _ = 1, 1000 do
  local items
  if desc then
    items = redis.call('ZREVRANGEBYSCORE', key, at, '-inf', 'WITHSCORES', 'LIMIT', offset, 200)
  else
    items = redis.call('ZRANGEBYSCORE', key, at, '+inf', 'WITHSCORES', 'LIMIT', offset, 200)
  end
  for i = 1, #items, 2 do
    local past = tonumber(items[i + 1]) ~= at
      or (desc and not bytes_le(member, items[i]))
      or (not desc and not bytes_le(items[i], member))
    if past then
      out[#out + 1] = items[i]
      out[#out + 1] = items[i + 1]
      if #out / 2 >= limit then return {size, out} end
    end
  end
  if #items < 400 then break end
  offset = offset + 200
end
return {size, out}

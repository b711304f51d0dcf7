-- history_size: an estimate of the Redis memory a shard's history takes: its finished
-- Lives, each a hash (its Plans are fields of it) with its entries in `finished` and
-- `lives`. MEMORY USAGE of a random sample of finished Lives gives the bytes of
-- an average one; each index entry is taken to cost what an entry of `finished` costs
-- on average (MEMORY USAGE of that sorted set over its size).
-- KEYS: 1 finished
-- ARGV: 1 prefix, 2 sample size
-- Returns {finished Lives, estimated bytes}
local n = redis.call('ZCARD', KEYS[1])
if n == 0 then return {0, 0} end
local total, seen = 0, 0
for _, uuid in ipairs(redis.call('ZRANDMEMBER', KEYS[1], tonumber(ARGV[2]))) do
  local life = redis.call('MEMORY', 'USAGE', life_key(uuid))
  if life then
    seen = seen + 1
    total = total + life
  end
end
if seen == 0 then return {n, 0} end
local entry = (redis.call('MEMORY', 'USAGE', KEYS[1]) or 0) / n
return {n, math.floor((total / seen + 2 * entry) * n)}

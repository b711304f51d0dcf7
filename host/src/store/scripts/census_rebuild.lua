#!lua flags=allow-oom
-- census_rebuild: counts the shard's Lives per state into `census` and marks it (`v`),
-- when it is not marked yet (a keyspace whose Lives were written before the census
-- existed). It reads every record of the shard in one step, once; the scripts keep the
-- marked census exact from then on (common.lua, `census`).
-- ARGV: 1 prefix
-- Returns 1 when it counted, 0 when the census was marked already.
local key = PREFIX .. 'census'
if redis.call('HEXISTS', key, 'v') == 1 then return 0 end
local counts = {}
for b = 0, record_buckets() - 1 do
  for _, rec in ipairs(redis.call('HVALS', PREFIX .. 'r:' .. b)) do
    local state = record_head(rec).state
    counts[state] = (counts[state] or 0) + 1
  end
end
redis.call('DEL', key)
local fields = {'v', 1}
for state, n in pairs(counts) do
  fields[#fields + 1] = state
  fields[#fields + 1] = n
end
redis.call('HSET', key, unpack(fields))
return 1

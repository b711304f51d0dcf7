-- history_size: an estimate of the Redis memory a shard's history takes: its finished
-- Lives, each a record in a bucket, an entry of the `finished` list and one of the
-- `lives` tree. The bytes of a sample of records spread evenly over the list (HSTRLEN),
-- plus what a listpack entry and its two index entries cost around them, give the bytes
-- of an average one.
-- KEYS: 1 finished (list)
-- ARGV: 1 prefix, 2 sample size
-- Returns {finished Lives, estimated bytes}
local ENTRY_BYTES = 8 + 2 * 50
local n = redis.call('LLEN', KEYS[1])
if n == 0 then return {0, 0} end
local total, seen = 0, 0
local want = math.min(tonumber(ARGV[2]), n)
for j = 0, want - 1 do
  local entry = redis.call('LINDEX', KEYS[1], math.floor(j * n / want))
  if entry then
    local uuid = string.sub(entry, 15)
    local bytes = redis.call('HSTRLEN', record_key(uuid), uuid)
    if bytes > 0 then
      seen = seen + 1
      total = total + bytes + #uuid + ENTRY_BYTES
    end
  end
end
if seen == 0 then return {n, 0} end
return {n, math.floor(total / seen * n)}

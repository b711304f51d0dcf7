-- Where a Life's record is (layout 4, docs/redis-layout.md); kairos prepends this to
-- common.lua and to replica_probe.lua. Records live in buckets `r:{n}` found by linear
-- hashing over the first 32 bits of the id's SHA-1.
local function id_hash(id)
  return tonumber(string.sub(redis.sha1hex(id), 1, 8), 16)
end

-- The bucket of hash H among N buckets: H mod 2P, or H mod P for a bucket not split yet
-- (P the largest power of two not above N).
local function bucket_index(h, n)
  local p = 1
  while p * 2 <= n do p = p * 2 end
  local b = h % (p * 2)
  if b >= n then b = h % p end
  return b
end

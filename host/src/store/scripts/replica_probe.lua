#!lua flags=allow-oom
-- replica_probe (store/replicas.rs, with record_bucket.lua, not common.lua): whether each
-- change waiting for its replicas is on this node, then a mark written after them, so
-- that the WAIT sent next on the same connection confirms every change found here.
-- KEYS: 1 the shard's `ack` mark, then per change the bucket count `rn` of the shard
--       of the Life it changed (the record's bucket is found from it)
-- ARGV: per change, '@{uuid}' (the record exists: a booking) or '@{uuid}@{fields}' (one
--       of the record's fields, one letter each, is at least the number that follows:
--       a later change implies this one), and that number
-- Returns per change 1 (here) or 0.
local function record_holds(count_key, spec, least)
  local uuid, fields = string.match(spec, '^@([^@]*)@?(.*)$')
  local prefix = string.sub(count_key, 1, #count_key - 2)
  local n = tonumber(redis.call('GET', count_key)) or 1
  local text = redis.call('HGET', prefix .. 'r:' .. bucket_index(id_hash(uuid), n), uuid)
  if not text then return false end
  if fields == '' then return true end
  local rec = cjson.decode(text)
  for i = 1, #fields do
    local value = tonumber(rec[string.sub(fields, i, i)])
    if value and value >= tonumber(least) then return true end
  end
  return false
end

local out = {}
for i = 2, #KEYS do
  local spec, least = ARGV[(i - 2) * 2 + 1], ARGV[(i - 2) * 2 + 2]
  out[#out + 1] = record_holds(KEYS[i], spec, least) and 1 or 0
end
redis.call('SET', KEYS[1], #out, 'PX', 60000)
return out

#!lua flags=allow-oom
-- replica_probe (store/replicas.rs, not prefixed with common.lua): whether each change
-- waiting for its replicas is on this node, then a mark written after them, so that the
-- WAIT sent next on the same connection confirms every change found here.
-- KEYS: 1 the shard's `ack` mark, then one key per change
-- ARGV: per change, a field ('' = the key exists is the proof) and the least number the
--       field must hold
-- Returns per change 1 (here) or 0.
local out = {}
for i = 2, #KEYS do
  local field, least = ARGV[(i - 2) * 2 + 1], ARGV[(i - 2) * 2 + 2]
  if field == '' then
    out[#out + 1] = redis.call('EXISTS', KEYS[i])
  else
    local value = tonumber(redis.call('HGET', KEYS[i], field))
    out[#out + 1] = (value and value >= tonumber(least)) and 1 or 0
  end
end
redis.call('SET', KEYS[1], #out, 'PX', 60000)
return out

-- records_get: the records of Lives (for a page of a listing), and each Plan's
-- `inflight` entry: per id, {record or '', birth's entry or '', death's entry or ''}.
-- KEYS: 1 inflight
-- ARGV: 1 prefix, then ids
local out = {}
for i = 2, #ARGV do
  local uuid = ARGV[i]
  local f = redis.call('HMGET', KEYS[1], uuid .. ':birth', uuid .. ':death')
  out[#out + 1] = {get_record(uuid) or '', f[1] or '', f[2] or ''}
end
return out

-- records_get: the records of Lives of the shard (for a page of a listing), '' for one
-- that is not there.
-- KEYS: 1 the shard's inflight (unread: it names the shard, and so the node to call)
-- ARGV: 1 prefix, then ids
local out = {}
for i = 2, #ARGV do
  out[#out + 1] = get_record(ARGV[i]) or ''
end
return out

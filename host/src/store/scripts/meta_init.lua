-- meta_init: records what a new keyspace is (its layout and number of shards), unless
-- another host did first; returns what is recorded. With a record format (a host's
-- open), it also raises `records` to it where the keyspace has its layout and an older
-- format: the host writes records that older builds cannot read.
-- KEYS: 1 meta
-- ARGV: 1 prefix, 2 layout, 3 shards, 4 created_at, 5 record format (optional)
-- Returns {layout, shards, records}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'layout', ARGV[2], 'shards', ARGV[3], 'created_at', ARGV[4])
end
local got = redis.call('HMGET', KEYS[1], 'layout', 'shards', 'records')
if ARGV[5] and got[1] == ARGV[2] and (tonumber(got[3]) or 0) < tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[1], 'records', ARGV[5])
  got[3] = ARGV[5]
end
return got

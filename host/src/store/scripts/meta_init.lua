-- meta_init: records what a new keyspace is (its layout and number of shards), unless
-- another host did first; returns what is recorded.
-- KEYS: 1 meta
-- ARGV: 1 prefix, 2 layout, 3 shards, 4 created_at
-- Returns {layout, shards}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'layout', ARGV[2], 'shards', ARGV[3], 'created_at', ARGV[4])
end
return redis.call('HMGET', KEYS[1], 'layout', 'shards')

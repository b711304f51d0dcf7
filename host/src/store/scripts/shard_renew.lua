#!lua flags=allow-oom
-- shard_renew: the shard's owner extends its lease, if it is still the owner (same host
-- and generation; a lease that ran out but was not taken over is still its own).
-- KEYS: 1 owner
-- ARGV: 1 prefix, 2 host, 3 gen, 4 lease ms
-- Returns 1 when renewed, 0 when the shard is another host's now.
local o = redis.call('HMGET', KEYS[1], 'host', 'gen')
if o[1] ~= ARGV[2] or o[2] ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'until', redis_now_ms() + tonumber(ARGV[4]))
return 1

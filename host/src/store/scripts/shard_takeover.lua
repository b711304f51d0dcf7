#!lua flags=allow-oom
-- shard_takeover: HOST takes the shard's lease when nobody holds it, its holder's lease
-- ran out (a crashed or frozen host), or its holder is HOST itself (a process restarted
-- under the same host id, whose predecessor is known to be gone). The generation goes
-- up by one: every claim and start of the previous holder is refused from now on.
-- Then the Plans the previous holder had claimed go back to the due sets in batches by
-- shard_release (a run that was cut off is recorded as interrupted).
-- KEYS: 1 owner
-- ARGV: 1 prefix, 2 host, 3 lease ms
-- Returns {gen, previous host or ''} when taken, {0, holder} when another live host holds it.
local host, lease = ARGV[2], tonumber(ARGV[3])
local now = redis_now_ms()
local o = redis.call('HMGET', KEYS[1], 'host', 'gen', 'until')
if o[1] and o[1] ~= '' and o[1] ~= host and tonumber(o[3] or 0) >= now then
  return {0, o[1]}
end
local gen = (tonumber(o[2]) or 0) + 1
redis.call('HSET', KEYS[1], 'host', host, 'gen', gen, 'until', now + lease, 'since', now)
return {gen, o[1] or ''}

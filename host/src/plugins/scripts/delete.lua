-- delete: deletes a plugin and every version of it.
-- KEYS: 1 plugins set, 2 latest hash, 3 wasm-refs;
-- ARGV: 1 prefix, 2 name, 3 force ('1' or '0'), 4 unfinished Lives and timers using it
-- (counted across the shards by the caller)
-- A name whose only versions are still compiling has no latest hash yet: the set says
-- whether it is registered, and the version counter how far its versions go.
if redis.call('SISMEMBER', KEYS[1], ARGV[2]) == 0 then return {'missing', 0} end
local unfinished = tonumber(ARGV[4])
if unfinished > 0 and ARGV[3] ~= '1' then return {'in_use', unfinished} end
local last = tonumber(redis.call('HGET', ARGV[1] .. 'plugin-versions', ARGV[2]) or '0')
last = math.max(last, tonumber(redis.call('HGET', KEYS[2], 'version') or '0'))
for v = 1, last do
  local key = ARGV[1] .. 'plugin:' .. ARGV[2] .. ':v' .. v
  local digest = redis.call('HGET', key, 'digest')
  if digest then
    if redis.call('HINCRBY', KEYS[3], digest, -1) <= 0 then
      redis.call('HDEL', KEYS[3], digest)
      redis.call('DEL', ARGV[1] .. 'wasm:' .. digest)
    end
    redis.call('DEL', key)
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[1], ARGV[2])
return {'deleted', unfinished}

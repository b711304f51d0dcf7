-- promote: the end of a version's compile in the background. Ready, it becomes the
-- latest (what `name` resolves to) unless a newer one is already, with the input schema
-- the component declares; failed, it keeps its error and the latest stays as it was.
-- Whichever host ends the compile first writes this; the others find it done.
-- KEYS: 1 latest hash, 2 version hash
-- ARGV: 1 'ready' | 'failed', 2 the input schema ('' none) or the error, 3 the digest
-- compiled
-- Returns 1 when written, 0 when the version is gone or no longer compiling.
local state, digest = unpack(redis.call('HMGET', KEYS[2], 'state', 'digest'))
if state ~= 'compiling' or digest ~= ARGV[3] then return 0 end
if ARGV[1] == 'failed' then
  redis.call('HSET', KEYS[2], 'state', 'failed', 'error', ARGV[2])
  return 1
end
redis.call('HDEL', KEYS[2], 'state')
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], 'input_schema', ARGV[2]) end
local version = tonumber(redis.call('HGET', KEYS[2], 'version'))
local latest = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version > latest then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(redis.call('HGETALL', KEYS[2])))
end
return 1

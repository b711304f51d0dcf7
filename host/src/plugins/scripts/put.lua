-- put: stores a new version of a plugin.
-- KEYS: 1 plugins set, 2 latest hash, 3 wasm-refs, 4 wasm:{digest}; ARGV: 1 prefix,
-- 2 name, 3 digest, 4 size, 5 allowed_hosts, 6 memory_mb, 7 timeout_ms, 8 uploaded_at,
-- 9 uploaded_at_ms, 10 the component's bytes, 11 its input schema ('' when none),
-- 12 'compiling' when its compile goes on in the background ('' when it is done).
-- The bytes are stored here, with the reference that keeps them: written apart, a DELETE
-- of the digest's last other user could run in between and remove them.
-- A version still compiling is written as `plugin:{name}:v{n}` with `state` `compiling`
-- only: the latest hash, which `name` resolves to, keeps the version before until the
-- compile ends (promote.lua).
redis.call('SET', KEYS[4], ARGV[10], 'NX')
local version = redis.call('HINCRBY', ARGV[1] .. 'plugin-versions', ARGV[2], 1)
-- A name uploaded before this counter existed goes on from its latest version.
local latest = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if version <= latest then
  version = latest + 1
  redis.call('HSET', ARGV[1] .. 'plugin-versions', ARGV[2], version)
end
local fields = {'name', ARGV[2], 'version', version, 'digest', ARGV[3], 'size', ARGV[4],
  'allowed_hosts', ARGV[5], 'memory_mb', ARGV[6], 'timeout_ms', ARGV[7],
  'uploaded_at', ARGV[8], 'uploaded_at_ms', ARGV[9]}
if ARGV[11] ~= '' then
  fields[#fields + 1] = 'input_schema'
  fields[#fields + 1] = ARGV[11]
end
if ARGV[12] == 'compiling' then
  fields[#fields + 1] = 'state'
  fields[#fields + 1] = 'compiling'
else
  -- The latest hash is replaced whole: a new version without a schema keeps none.
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], unpack(fields))
end
redis.call('HSET', ARGV[1] .. 'plugin:' .. ARGV[2] .. ':v' .. version, unpack(fields))
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
redis.call('SADD', KEYS[1], ARGV[2])
return version

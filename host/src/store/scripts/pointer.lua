-- pointer: the pointer in a Life id's home shard to the shard its Life is in, written
-- when a Life's resource puts it in another shard than its id's, so that a Life is found
-- by id alone (its home shard, then the pointer). Values are `{shard}:{written ms}`.
-- KEYS: 1 pointer (in the home shard)
-- ARGV: 1 prefix (the home shard's), 2 mode, 3 value, 4 expected value, 5 the Life's id
-- mode 'set': {'duplicate'} when a Life with this id is in the home shard itself;
--   {'set'} when there was no pointer and now there is VALUE; {'same', current} when the
--   pointer names VALUE's shard already; {'other', current} when it names another.
-- mode 'replace': sets VALUE if the pointer is still EXPECTED: {'set'} | {'other', current}
-- mode 'drop': deletes the pointer if it is still EXPECTED, or, EXPECTED ending in ':',
--   if it names that shard: {'dropped'} | {'kept'}
local mode, value, expected = ARGV[2], ARGV[3], ARGV[4]
local current = redis.call('GET', KEYS[1])
local function shard_of(v) return string.match(v or '', '^(%d+):') end
if mode == 'set' then
  if get_record(ARGV[5]) then return {'duplicate'} end
  if not current then
    redis.call('SET', KEYS[1], value)
    return {'set'}
  end
  if shard_of(current) == shard_of(value) then return {'same', current} end
  return {'other', current}
elseif mode == 'replace' then
  if current ~= expected then return {'other', current or ''} end
  redis.call('SET', KEYS[1], value)
  return {'set'}
else
  local match = current == expected
  if string.sub(expected, -1) == ':' then match = (shard_of(current) or '') .. ':' == expected end
  if current and match then
    redis.call('DEL', KEYS[1])
    return {'dropped'}
  end
  return {'kept'}
end

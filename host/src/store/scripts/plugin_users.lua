-- plugin_users: one page of what in this shard uses plugin NAME (GET and DELETE
-- /plugins/{name} add the shards up), so that a plugin with a million Lives, or a shard
-- with many timers, never holds Redis for more than a moment: the caller asks again with
-- the returned cursor until it comes back '0'.
-- - WHAT 'lives': one SSCAN of about COUNT members of plugin-lives:{name}, from CURSOR
--   ('0' to begin); returns the uuids of the unfinished Lives (SSCAN may return a member
--   twice: the caller drops repeats) and forgets the finished ones.
-- - WHAT 'timers': up to COUNT timer names from the shard's index, from CURSOR ('-' to
--   begin, then the returned '(name'); returns the names of those whose action names the
--   plugin.
-- KEYS: 1 plugin-lives:{name}, 2 timers index
-- ARGV: 1 prefix, 2 name, 3 what, 4 cursor, 5 count
-- Returns {next cursor ('0': done), {uuids or timer names}}.
local count = tonumber(ARGV[5])
local found = {}
if ARGV[3] == 'lives' then
  local page = redis.call('SSCAN', KEYS[1], ARGV[4], 'COUNT', count)
  local gone = {}
  for _, uuid in ipairs(page[2]) do
    local rec = get_record(uuid)
    local state = rec and record_head(rec).state
    if state == 'Inexistent' or state == 'Alive' then
      found[#found + 1] = uuid
    else
      gone[#gone + 1] = uuid
    end
  end
  if #gone > 0 then redis.call('SREM', KEYS[1], unpack(gone)) end
  return {page[1], found}
end
-- Timers keep their action in their hash: look at each of the page.
local names = redis.call('ZRANGEBYLEX', KEYS[2], ARGV[4], '+', 'LIMIT', 0, count)
for _, timer in ipairs(names) do
  local action = redis.call('HGET', PREFIX .. 'timer:' .. timer, 'action')
  if action then
    local ok, decoded = pcall(cjson.decode, action)
    if ok and type(decoded) == 'table' and type(decoded.plugin) == 'string'
        and string.match(decoded.plugin, '^[^@]+') == ARGV[2] then
      found[#found + 1] = timer
    end
  end
end
if #names < count then return {'0', found} end
return {'(' .. names[#names], found}

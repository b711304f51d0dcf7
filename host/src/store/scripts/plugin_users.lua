-- plugin_users: one page of the unfinished Lives of this shard that use plugin NAME, and
-- on the first page the shard's timers that use it (GET and DELETE /plugins/{name} add
-- the shards up); finished Lives are forgotten on the way. A page is one SSCAN of at most
-- about COUNT members, so that a plugin with a million Lives never holds Redis for more
-- than a moment: the caller asks again with the cursor until it comes back '0'.
-- KEYS: 1 plugin-lives:{name}, 2 timers index
-- ARGV: 1 prefix, 2 name, 3 cursor ('0': the first page), 4 COUNT
-- Returns {next cursor, {uuids of the unfinished Lives on this page}, {timer names}}: the
-- ids, not a count, since SSCAN may return a member twice (the caller drops repeats).
local page = redis.call('SSCAN', KEYS[1], ARGV[3], 'COUNT', ARGV[4])
local unfinished = {}
local gone = {}
for _, uuid in ipairs(page[2]) do
  local state = redis.call('HGET', life_key(uuid), 'state')
  if state == 'Inexistent' or state == 'Alive' then
    unfinished[#unfinished + 1] = uuid
  else
    gone[#gone + 1] = uuid
  end
end
if #gone > 0 then redis.call('SREM', KEYS[1], unpack(gone)) end
-- Timers keep their action in their hash; there are few of them, so look at each, once.
local timers = {}
if ARGV[3] == '0' then
  for _, timer in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local action = redis.call('HGET', PREFIX .. 'timer:' .. timer, 'action')
    if action then
      local ok, decoded = pcall(cjson.decode, action)
      if ok and type(decoded) == 'table' and type(decoded.plugin) == 'string'
          and string.match(decoded.plugin, '^[^@]+') == ARGV[2] then
        timers[#timers + 1] = timer
      end
    end
  end
end
return {page[1], unfinished, timers}

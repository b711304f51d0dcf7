-- plugin_users: the unfinished Lives and the timers of this shard that use plugin NAME
-- (GET and DELETE /plugins/{name} add the shards up); finished Lives are forgotten on
-- the way.
-- KEYS: 1 plugin-lives:{name}, 2 timers index
-- ARGV: 1 prefix, 2 name
-- Returns {number of unfinished Lives, {timer names}}.
local unfinished = 0
for _, uuid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local state = redis.call('HGET', life_key(uuid), 'state')
  if state == 'Inexistent' or state == 'Alive' then
    unfinished = unfinished + 1
  else
    redis.call('SREM', KEYS[1], uuid)
  end
end
-- Timers keep their action in their hash; there are few of them, so look at each.
local timers = {}
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
return {unfinished, timers}

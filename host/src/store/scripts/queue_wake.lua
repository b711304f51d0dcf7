#!lua flags=allow-oom
-- queue_wake: gives a running queue's free slots to its waiting tasks (common.lua). Run
-- by the supervisor every few seconds for every queue, so that a wake-up lost to a crash,
-- a limit raised by PUT, or a resume cut short never strands a task; the same for the
-- waiting tasks of up to ARGV[3] of its keys (per-key limits, common.lua).
-- KEYS: 1 queue
-- ARGV: 1 prefix, 2 queue, 3 most to move, 4 notify_before_ms
-- Returns the number of tasks moved to due_tasks.
local d = redis.call('HMGET', KEYS[1], 'state', 'max_concurrent')
if not d[1] or d[1] == 'paused' then return 0 end
local room = tonumber(ARGV[3])
local max_concurrent = tonumber(d[2]) or 0
if max_concurrent > 0 then
  room = math.min(room, max_concurrent - redis.call('SCARD', KEYS[1] .. ':running'))
end
local moved = wake_waiting(ARGV[2], room, ARGV[4])
local per_key = tonumber(redis.call('HGET', KEYS[1], 'max_concurrent_per_key')) or 0
for _, ck in ipairs(redis.call('SRANDMEMBER', KEYS[1] .. ':kwaiting', tonumber(ARGV[3]))) do
  local key_room = tonumber(ARGV[3])
  if per_key > 0 then
    key_room = math.min(key_room,
      per_key - (tonumber(redis.call('HGET', KEYS[1] .. ':key_running', ck)) or 0))
  end
  moved = moved + wake_key(ARGV[2], ck, key_room, ARGV[4])
end
return moved

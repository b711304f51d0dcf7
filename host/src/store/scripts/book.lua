#!lua
-- book: creates Lives and their Plans, each whole or not at all (common.lua's book_life
-- says how): the bookings that reached a host while its last call was under way, in one
-- call (store/book_batch.rs). Each booking is judged on its own, after the ones before
-- it in the call, as if each had come alone in that order.
-- KEYS: 1 the due tree of the first booking's shard (it names the node to call; on a
--       Redis Cluster every booking of a call is of that shard)
-- ARGV: 1 '' (each booking brings its shard's prefix), then per booking: prefix, uuid,
--       resource_id ('' = none), birth_ms, death_ms ('' for a point), record JSON,
--       guard_ms, notify_before_ms, whether to look for a pointer ('1' or ''), the
--       number of plugins its actions use, their names
-- Returns per booking two values: book_life's answer and its detail ('' for none), or
--   'error' and the message of the command that failed.
-- The shebang (no flags) makes Redis refuse the whole call at its start when it is at
-- its maxmemory (507 to each booking, nothing written), where a script without one is
-- refused at its first write, which the pcall below would take for one booking's error.
local out = {}
local a = 2
batch_begin()
while a <= #ARGV do
  local args
  args, a = book_argv(a)
  -- A booking that fails (a command's error: a key of the wrong type written by hand)
  -- answers its error and stops no other: the bookings before it stay written and are
  -- answered as such.
  local ok, booked = pcall(book_life, unpack(args))
  if not ok then
    booked = {'error', type(booked) == 'table' and tostring(booked.err) or tostring(booked)}
  end
  out[#out + 1] = booked[1]
  out[#out + 1] = booked[2] or ''
end
batch_end()
return out

-- book_idem: a booking call made with an `Idempotency-Key`, in one step when the key's
-- record and the Life share a shard (the Life id the call derives from the key is drawn
-- to land there). It answers from the record when the key was used before; otherwise it
-- books, and on success records the answer (pre-rendered by the caller) for repeats.
-- A booking refused here records nothing: the caller then takes the two-step way
-- (idem_begin, the call, idem_finish), which records the refusal. So does a record left
-- `pending` by a host that died (`stale`): the two-step way retakes it.
-- KEYS: 1 due (tree), 2 lives (tree), 3 resource index, 4 the key's record, the
--       `plugin-lives:{name}` sets of the plugins the actions use from KEYS[5] (declared
--       for a Redis Cluster's routing: book_life builds them from the prefix, as book.lua)
-- ARGV: the booking as one of book.lua's (prefix, uuid, resource_id, birth_ms, death_ms,
--       record JSON, guard_ms, notify_before_ms, '1' (look for a pointer), the count of
--       plugins, their names), then
--       fingerprint, pending_ms, ttl_ms, status and body of the answer to record
-- Returns book_life's answers, or {'reused'} | {'replay', status, body} |
--   {'in_progress'} | {'stale'}
local args, a = book_argv(1)
local fp, pending_ms, ttl_ms, status, body = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
  ARGV[a + 4]
local found = idem_lookup(KEYS[4], fp, pending_ms)
if found then return found end
local booked = book_life(unpack(args))
if booked[1] == 'ok' then
  redis.call('HSET', KEYS[4], 'fp', fp, 'state', 'done', 'status', status, 'body', body)
  redis.call('PEXPIRE', KEYS[4], ttl_ms)
end
return booked

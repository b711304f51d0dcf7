-- book_idem: a booking call made with an `Idempotency-Key`, in one step when the key's
-- record and the Life share a shard (the Life id the call derives from the key is drawn
-- to land there). It answers from the record when the key was used before; otherwise it
-- books, and on success records the answer (pre-rendered by the caller) for repeats.
-- A booking refused here records nothing: the caller then takes the two-step way
-- (idem_begin, the call, idem_finish), which records the refusal. So does a record left
-- `pending` by a host that died (`stale`): the two-step way retakes it.
-- KEYS: those of book_life (1-3), then 4 the key's record, the plugin sets from KEYS[5]
-- ARGV: those of book_life (1-9), then 10 fingerprint, 11 pending_ms, 12 ttl_ms,
--       13 status and 14 body of the answer to record
-- Returns book_life's answers, or {'reused'} | {'replay', status, body} |
--   {'in_progress'} | {'stale'}
local found = idem_lookup(KEYS[4], ARGV[10], ARGV[11])
if found then return found end
local booked = book_life(5)
if booked[1] == 'ok' then
  redis.call('HSET', KEYS[4], 'fp', ARGV[10], 'state', 'done', 'status', ARGV[13], 'body', ARGV[14])
  redis.call('PEXPIRE', KEYS[4], ARGV[12])
end
return booked

-- book_idem: a booking call made with an `Idempotency-Key`, in one step when the key's
-- record and the Life share a shard (the Life id the call derives from the key is drawn
-- to land there). It answers from the record when the key was used before; otherwise it
-- books, and on success records the answer (pre-rendered by the caller) for repeats.
-- A booking refused here records nothing: the caller then takes the two-step way
-- (idem_begin, the call, idem_finish), which records the refusal. So does a record left
-- `pending` by a host that died (`stale`): the two-step way retakes it.
-- KEYS: those of book_life, then 5 the key's record, the plugin sets from KEYS[6]
-- ARGV: those of book_life (1-11), then 12 fingerprint, 13 pending_ms, 14 ttl_ms,
--       15 status and 16 body of the answer to record
-- Returns book_life's answers, or {'reused'} | {'replay', status, body} |
--   {'in_progress'} | {'stale'}
local found = idem_lookup(KEYS[5], ARGV[12], ARGV[13])
if found then return found end
local booked = book_life(6)
if booked[1] == 'ok' then
  redis.call('HSET', KEYS[5], 'fp', ARGV[12], 'state', 'done', 'status', ARGV[15], 'body', ARGV[16])
  redis.call('PEXPIRE', KEYS[5], ARGV[14])
end
return booked

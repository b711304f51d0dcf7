-- book_idem: a booking call made with an `Idempotency-Key`, in one step when the key's
-- record and the Life share a shard (the Life id the call derives from the key is drawn
-- to land there). It answers from the record when the key was used before; otherwise it
-- books, and on success records the answer (pre-rendered by the caller) for repeats.
-- A booking refused here records nothing: the caller then takes the two-step way
-- (idem_begin, the call, idem_finish), which records the refusal. So does a record left
-- `pending` by a host that died (`stale`): the two-step way retakes it.
-- KEYS: 1 due (tree), 2 lives (tree), 3 resource index, 4 the key's record, the
--       `plugin-lives:{name}` sets of the plugins the actions use from KEYS[5]
-- ARGV: 1 prefix, 2 uuid, 3 resource_id ('' = none), 4 birth_ms, 5 death_ms ('' for
--       point), 6 record JSON, 7 now_ms, 8 guard_ms, 9 notify_before_ms, then 10
--       fingerprint, 11 pending_ms, 12 ttl_ms,
--       13 status and 14 body of the answer to record
-- Returns book_life's answers, or {'reused'} | {'replay', status, body} |
--   {'in_progress'} | {'stale'}
local found = idem_lookup(KEYS[4], ARGV[10], ARGV[11])
if found then return found end
local plugins = {}
for i = 5, #KEYS do plugins[#plugins + 1] = KEYS[i] end
local booked = book_life(KEYS[1], KEYS[2], KEYS[3], plugins, ARGV[2], ARGV[3], ARGV[4],
  ARGV[5], ARGV[6], ARGV[8], ARGV[9])
if booked[1] == 'ok' then
  redis.call('HSET', KEYS[4], 'fp', ARGV[10], 'state', 'done', 'status', ARGV[13], 'body', ARGV[14])
  redis.call('PEXPIRE', KEYS[4], ARGV[12])
end
return booked

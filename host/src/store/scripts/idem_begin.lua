-- idem_begin: the first step of a booking call made with an `Idempotency-Key` that
-- book_idem cannot make in one step. The record `idem:{key}` lives in the key's own
-- shard, and what the call books may live elsewhere (a Life lives in its resource's
-- shard), so the call is two steps: this one, then idem_finish once the answer is known.
-- A call whose host died between the two leaves the record `pending`; a later call with
-- the same key takes it over (`retake`) and books again, which the caller makes safe: ids
-- it generates come from the key, and an identical object already there is its own.
-- KEYS: 1 the key's record
-- ARGV: 1 prefix, 2 fingerprint of the request (method, path, headers that matter, body),
--       3 pending_ms (a pending record younger than this is a call still under way),
--       4 ttl_ms (how long an answer is replayed)
-- Returns {'new'} | {'replay', status, body} | {'reused'} | {'in_progress'} | {'retake'}
local found = idem_lookup(KEYS[1], ARGV[2], ARGV[3])
if not found then
  redis.call('HSET', KEYS[1], 'fp', ARGV[2], 'state', 'pending', 'at_ms', redis_now_ms())
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {'new'}
end
if found[1] ~= 'stale' then return found end
redis.call('HSET', KEYS[1], 'at_ms', redis_now_ms())
return {'retake'}

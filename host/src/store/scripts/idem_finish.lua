-- idem_finish: records the answer of a booking call made with an `Idempotency-Key`, to
-- be replayed to every later call with the same key and request until the record
-- expires (idem_begin set its expiry). An answer that must not be replayed (a 5xx: the
-- call may be tried again) forgets the record instead.
-- KEYS: 1 the key's record
-- ARGV: 1 prefix, 2 fingerprint, 3 status ('' = forget the record), 4 body
-- Returns 1, or 0 when the record is gone or belongs to another request.
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[3], 'body', ARGV[4])
redis.call('HDEL', KEYS[1], 'at_ms')
return 1

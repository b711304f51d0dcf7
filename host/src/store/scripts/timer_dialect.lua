-- Rewrites a timer's schedule written before the unix dialect (schedule/legacy.rs), once:
-- only while the hash has no `dialect` and still holds the text that was converted, so
-- that hosts starting together, or a PATCH in between, never lose a change.
-- KEYS: timer hash. ARGV: prefix, old schedule, new schedule, dialect.
-- Returns 1 when rewritten, 0 when there was nothing to do.
if redis.call('HEXISTS', KEYS[1], 'dialect') == 1 then return 0 end
if redis.call('HGET', KEYS[1], 'schedule') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'schedule', ARGV[3], 'schedule_legacy', ARGV[2], 'dialect', ARGV[4])
return 1

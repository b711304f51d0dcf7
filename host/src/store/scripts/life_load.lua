-- life_load: a Life as the host reads it to change it or show it: its record and its
-- Plans' `inflight` entries (Preset or Running), in one step.
-- KEYS: 1 inflight
-- ARGV: 1 prefix, 2 uuid
-- Returns {record or '', birth's entry or '', death's entry or ''}
local uuid = ARGV[2]
local inflight = redis.call('HMGET', KEYS[1], uuid .. ':birth', uuid .. ':death')
return {get_record(uuid) or '', inflight[1] or '', inflight[2] or ''}

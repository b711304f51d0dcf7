-- finished_excess: when the shard keeps more than KEEP finished Lives, how many of the
-- oldest to delete (at most BATCH) and the finish time of the last of them: the cutoff
-- to sweep them with.
-- KEYS: 1 finished (list)
-- ARGV: 1 prefix, 2 keep, 3 batch
-- Returns {excess (0: none), cutoff ms}
local count = redis.call('LLEN', KEYS[1])
local keep, batch = tonumber(ARGV[2]), tonumber(ARGV[3])
if count <= keep then return {0, 0} end
local excess = math.min(count - keep, batch)
local last = redis.call('LINDEX', KEYS[1], excess - 1)
return {excess, tonumber(string.sub(last, 1, 13))}

-- inflight_scan: a page of the shard's `inflight` entries (Lives' Plans claimed or
-- running) of HOST that are due before BEFORE, for the owner's audit: from CURSOR (HSCAN's,
-- '0' to begin), about COUNT entries looked at.
-- KEYS: 1 inflight
-- ARGV: 1 prefix, 2 host, 3 before ms, 4 cursor, 5 count
-- Returns {next cursor ('0': the end), {plan_id, claim, ...}}
local page = redis.call('HSCAN', KEYS[1], ARGV[4], 'COUNT', tonumber(ARGV[5]))
local found = {}
local before = tonumber(ARGV[3])
for i = 1, #page[2], 2 do
  local f = inflight_parse(page[2][i + 1])
  if f and f.host == ARGV[2] and f.fire_ms < before then
    found[#found + 1] = page[2][i]
    found[#found + 1] = f.claim
  end
end
return {page[1], found}

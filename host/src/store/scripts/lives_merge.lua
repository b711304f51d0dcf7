-- lives_merge: the next Lives of the listing from every shard of a standalone Redis, in
-- one call: the shards' `lives` trees merged here, in the listing's one order, and the
-- records of only the Lives the page takes. (A Redis Cluster's shards lie in other
-- slots: there the listing calls lives_page per shard and merges on the host.)
-- Each shard is read a few members at a time, and again only when the merge has taken
-- all it read and it may have more, so that a page of 50 from 32 shards reads about 100
-- members, not the page's share with room from each.
-- KEYS: each shard's lives tree
-- ARGV: 1 the first shard's prefix, 2 from ms, 3 after (a uuid, or ''), 4 to ms or
--       '+inf', 5 how many to take, 6 'asc' | 'desc' (as lives_page)
-- Returns {complete ('1': the range holds no more), then per Life taken: member, birth
--   ms, the index of its tree in KEYS, its record ('' when it is gone)}
local take = tonumber(ARGV[5])
local desc = ARGV[6] == 'desc'
local FIRST_READ = 4

-- Reads the next members of shard S: `items` ({member, score, ...}, taken from `at`),
-- whether it may have more, how many its next read asks for, and where it goes on from.
local function read(s)
  local want = s.want
  if desc then
    s.items = tree_rev_range(s.tree, s.score, s.member, ARGV[2], want)
  else
    s.items = tree_range(s.tree, s.score, s.member, ARGV[4], want)
  end
  s.at = 1
  s.more = #s.items / 2 == want
  s.want = math.min(want * 2, 64)
  if #s.items > 0 then
    s.score, s.member = s.items[#s.items], s.items[#s.items - 1]
  end
end

-- A shard's next member and its score as a number (`head`, `hs`): the heap compares
-- them many times.
local function set_head(s)
  s.head = s.items[s.at]
  s.hs = tonumber(s.items[s.at + 1])
end

-- A binary heap of the shards with members left, by their next member: whether X's
-- comes first in the listing's order.
local heap = {}
local function less(x, y)
  local a, b = x.hs, y.hs
  if a ~= b then
    if desc then return a > b end
    return a < b
  end
  if desc then return not bytes_le(x.head, y.head) end
  return not bytes_le(y.head, x.head)
end
local function sift_up(i)
  while i > 1 do
    local p = math.floor(i / 2)
    if not less(heap[i], heap[p]) then return end
    heap[i], heap[p] = heap[p], heap[i]
    i = p
  end
end
local function sift_down(i)
  local n = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and less(heap[l], heap[m]) then m = l end
    if r <= n and less(heap[r], heap[m]) then m = r end
    if m == i then return end
    heap[i], heap[m] = heap[m], heap[i]
    i = m
  end
end

local start = desc and ARGV[4] or ARGV[2]
for i = 1, #KEYS do
  local s = {tree = KEYS[i], prefix = string.sub(KEYS[i], 1, -6), index = i, score = start,
    member = ARGV[3], want = FIRST_READ}
  if take > 0 then
    read(s)
    if #s.items > 0 then
      set_head(s)
      heap[#heap + 1] = s
      sift_up(#heap)
    end
  end
end

local out = {'0'}
local taken = 0
while taken < take and #heap > 0 do
  local s = heap[1]
  local member, score = s.items[s.at], s.items[s.at + 1]
  enter_shard(s.prefix)
  out[#out + 1] = member
  out[#out + 1] = score
  out[#out + 1] = s.index
  out[#out + 1] = get_record(member) or ''
  taken = taken + 1
  s.at = s.at + 2
  if s.at > #s.items then
    if s.more then read(s) else s.items = {} end
  end
  if s.at > #s.items then
    heap[1] = heap[#heap]
    heap[#heap] = nil
  else
    set_head(s)
  end
  if #heap > 0 then sift_down(1) end
end
if #heap == 0 then out[1] = '1' end
return out

-- Helpers shared by the scripts below; kairos prepends this file to each of them.
-- Every key is built from PREFIX (ARGV[1] of every script): the prefix of one shard,
-- `{key_prefix}:{tag}:`, so that a script touches the keys of one shard only, all in one
-- Redis Cluster slot (store/shards.rs).

local PREFIX = ARGV[1]

local function plan_key(plan_id) return PREFIX .. 'plan:' .. plan_id end

-- An integer as the text a command takes. A Lua number given to redis.call is printed
-- with `%.17g` (Redis 7.0's Lua bridge), and one joined to a string with `%.14g`: both
-- go through the C library's floating-point printing, which showed in Redis's profile of
-- a listing page; `%d` does not. Hot paths pass counts and times through this, and
-- constants as strings ('0', '1').
local function int_arg(n) return string.format('%d', n) end

-- A timer's or a queue task's Plan is a hash of its own, `plan:{id}`, with plain field
-- names. (A Life's Plans are in its record: layout 4 below.) Scripts reach such a Plan
-- through plan_of, which gives its key and its field names:
--   local pk, pn = plan_of(plan_id)
--   redis.call('HMGET', pk, pn.state, pn.fire_at_ms)
local PN = setmetatable({}, {__index = function(t, name)
  rawset(t, name, name)
  return name
end})

local function plan_of(plan_id)
  return plan_key(plan_id), PN
end

-- Whether the Plan exists (every Plan has a `state`).
local function plan_exists(plan_id)
  local pk, pn = plan_of(plan_id)
  return redis.call('HEXISTS', pk, pn.state) == 1
end

-- Takes a Plan back from the host that holds it in memory. The holder's timer entry
-- then fails the fencing check of start_run (state or claim number differ) and is
-- dropped, so a Plan moved by PATCH or DELETE never fires at its old time.
local function release_claim(plan_id)
  local pk, pn = plan_of(plan_id)
  if redis.call('HDEL', pk, pn.lease_owner) == 1 then
    redis.call('ZREM', PREFIX .. 'held', plan_id)
  end
end

-- Lives per state in the shard (`census`, a hash: state -> count). Each script that
-- creates a Life, changes its state or deletes it counts the change here, so that the
-- overview reads five numbers a shard instead of every Life. FROM or TO may be nil/false
-- (a Life created or deleted). `census_rebuild` recounts a shard whose census lacks its
-- `v` mark (a keyspace written before it).
-- A script that changes many Lives (finish_life, book) calls `batch_begin` first and
-- `batch_end` last: between the two, census changes add up in memory, per shard, and are
-- written as one HINCRBY a state and shard at the end, instead of one or two a Life.
local census_batch = nil
local CENSUS_STATES = {'Inexistent', 'Alive', 'Dead', 'Stillbirth', 'Invalidated'}

local function census(from, to)
  if census_batch then
    local c = census_batch[PREFIX]
    if not c then
      c = {}
      census_batch[PREFIX] = c
    end
    if from then c[from] = (c[from] or 0) - 1 end
    if to then c[to] = (c[to] or 0) + 1 end
    return
  end
  if from then redis.call('HINCRBY', PREFIX .. 'census', from, '-1') end
  if to then redis.call('HINCRBY', PREFIX .. 'census', to, '1') end
end

local function batch_begin()
  census_batch = {}
end

local function batch_end()
  for prefix, c in pairs(census_batch) do
    for _, state in ipairs(CENSUS_STATES) do
      local n = c[state]
      if n and n ~= 0 then
        redis.call('HINCRBY', prefix .. 'census', state, string.format('%d', n))
      end
    end
  end
  census_batch = nil
end

-- Redis's own clock, in ms: the one clock every host agrees on. Scripts that judge
-- lateness or leases use it, never the caller's (a host frozen and resumed has a stale
-- idea of now). Read once a call: a call runs whole before any other command, and a
-- call of many shards (start_run's sections) judges each by the same now.
local now_ms_of_call = nil
local function redis_now_ms()
  if not now_ms_of_call then
    local t = redis.call('TIME')
    now_ms_of_call = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms_of_call
end

-- Whether HOST works this shard under generation GEN: it owns the shard's lease
-- (`owner`: host, gen, until) and the lease has not run out by Redis's clock.
-- 'ok' | 'expired' (ours, but run out: renew first) | 'lost' (another owner, or none).
local function ownership(host, gen)
  local o = redis.call('HMGET', PREFIX .. 'owner', 'host', 'gen', 'until')
  if o[1] ~= host or o[2] ~= gen then return 'lost' end
  if tonumber(o[3] or 0) < redis_now_ms() then return 'expired' end
  return 'ok'
end

-- The unfinished Plans of a resource, scored by the time each is due: a resource's Plan
-- runs only when it is the first of them (start_run), so the Plans of one resource never
-- overlap and never run out of order, across hosts and crashes. Booking adds a Life's
-- Plans; a Plan leaves when it ends for good (done, failed, cancelled, invalidated).
local function order_key(rid) return PREFIX .. 'order:' .. rid end

-- RID is the Plan's resource_id when the caller has read it already (false: it has none);
-- left out, it is read here.
local function leave_order(plan_id, rid)
  if rid == nil then
    local pk, pn = plan_of(plan_id)
    rid = redis.call('HGET', pk, pn.resource_id)
  end
  if rid then redis.call('ZREM', order_key(rid), plan_id) end
end

-- Appends a run to the shard's capped `runs` stream, for operators to tail. The run's
-- history proper lives with its Life, timer or task; the stream is a second copy that
-- costs Redis CPU and memory on every fire, so it is off unless the operator sets
-- runs_stream_max_len (MAX_LEN '0': off).
local function add_run(stream, max_len, ...)
  if max_len ~= '0' then
    redis.call('XADD', stream, 'MAXLEN', '~', max_len, '*', ...)
  end
end

-- The queue of a task's Plan id (`{queue}/{task}:task`), nil for other Plans.
local function task_queue(plan_id)
  return string.match(plan_id, '^([^/]+)/.*:task$')
end

-- Wakes the shard's owner (`{prefix}:{tag}:notify`; hosts listen on every shard's
-- channel with one pattern) when a Plan became due within the look-ahead window.
local function notify_if_soon(fire_ms, notify_before_ms)
  if tonumber(fire_ms) <= tonumber(notify_before_ms) then
    redis.call('PUBLISH', PREFIX .. 'notify', fire_ms)
  end
end

-- A queue's tasks held back in Redis, Standby and in no due set: while the queue is
-- paused, or while it runs max_concurrent tasks already. They wait there costing no
-- host's memory, scored by their fire time, until a slot frees (finish_task, a
-- hand-back), the queue resumes or its limit grows (queue_put, queue_resume), or the
-- supervisor's periodic look (queue_wake) finds room.
local function waiting_key(queue) return PREFIX .. 'queue:' .. queue .. ':waiting' end

-- Moves up to N tasks of a running queue from its waiting set WK back to due_tasks,
-- oldest first. Returns how many moved.
local function wake_from(queue, wk, n, notify_before_ms)
  if n <= 0 then return 0 end
  if redis.call('HGET', PREFIX .. 'queue:' .. queue, 'state') == 'paused' then return 0 end
  local items = redis.call('ZRANGE', wk, 0, n - 1, 'WITHSCORES')
  if #items == 0 then return 0 end
  local ids = {}
  for i = 1, #items, 2 do
    ids[#ids + 1] = items[i]
    redis.call('ZADD', PREFIX .. 'due_tasks', items[i + 1], items[i])
  end
  redis.call('ZREM', wk, unpack(ids))
  notify_if_soon(items[2], notify_before_ms)
  return #ids
end

-- Moves up to N waiting tasks of a running queue back to due_tasks, oldest first.
local function wake_waiting(queue, n, notify_before_ms)
  return wake_from(queue, waiting_key(queue), n, notify_before_ms)
end

-- Per-key limits (a queue's `key`, `max_concurrent_per_key`, `rate_per_key`): a task
-- carries its key's value as `ck` (task_add). A task whose key runs its
-- max_concurrent_per_key already waits in that key's own waiting set, so that one busy
-- key never stands in front of the others; `kwaiting` lists the keys that have one.
-- `key_running` counts each key's runs, `running_key` names the key of each run
-- (`{plan}#{claim}` -> ck).
local function key_waiting_key(queue, ck)
  return PREFIX .. 'queue:' .. queue .. ':kwait:' .. ck
end

-- Drops key CK from the queue's `kwaiting` once its waiting set WK is empty.
local function forget_idle_key(queue, ck, wk)
  if redis.call('EXISTS', wk) == 0 then
    redis.call('SREM', PREFIX .. 'queue:' .. queue .. ':kwaiting', ck)
  end
end

-- Moves up to N of a key's waiting tasks back to due_tasks, oldest first (start_run
-- checks the key's limit again), and drops the key from `kwaiting` once none waits.
-- Returns how many moved.
local function wake_key(queue, ck, n, notify_before_ms)
  local wk = key_waiting_key(queue, ck)
  local moved = wake_from(queue, wk, n, notify_before_ms)
  forget_idle_key(queue, ck, wk)
  return moved
end

-- A task leaves whichever waiting set holds it (deleted, purged, or run by hand).
local function leave_waiting(queue, plan_id)
  redis.call('ZREM', waiting_key(queue), plan_id)
  local pk, pn = plan_of(plan_id)
  local ck = redis.call('HGET', pk, pn.ck)
  if ck then
    local wk = key_waiting_key(queue, ck)
    if redis.call('ZREM', wk, plan_id) == 1 then forget_idle_key(queue, ck, wk) end
  end
end

-- A queue task's run is over (finished, handed back or purged): it leaves the queue's
-- running set and its key's count, and the slot it frees goes to the first waiting task
-- of the queue and of its key. Under max_concurrent, every slot free now goes to a
-- waiting task, not only this one: a task woken may still have to wait for its token
-- (start_run reserves it and leaves the slot free meanwhile), and the tasks behind it
-- must be able to reserve the tokens that follow, or the queue would run one token's
-- round trip at a time, below its rate.
local function leave_running(queue, member, notify_before_ms)
  local qk = PREFIX .. 'queue:' .. queue
  local running = qk .. ':running'
  if redis.call('SREM', running, member) == 1 then
    local max_concurrent = tonumber(redis.call('HGET', qk, 'max_concurrent')) or 0
    local free = 1
    if max_concurrent > 0 then
      free = math.max(max_concurrent - redis.call('SCARD', running), 1)
    end
    wake_waiting(queue, free, notify_before_ms)
  end
  local ck = redis.call('HGET', qk .. ':running_key', member)
  if ck then
    redis.call('HDEL', qk .. ':running_key', member)
    if redis.call('HINCRBY', qk .. ':key_running', ck, -1) <= 0 then
      redis.call('HDEL', qk .. ':key_running', ck)
    end
    wake_key(queue, ck, 1, notify_before_ms)
  end
end

-- Puts a timer's or a task's Plan held in this shard (Preset or Running) back into its due
-- set (`timers_due`, `due_tasks`) at its own
-- fire time; returns 1 if it moved, 0 if it was not held any more. A Running Plan moves
-- only if it started before RUNNING_BEFORE_MS (nil: any), so that a live host's audit
-- never takes away a run that has just begun; CLAIM, when given, must be the Plan's
-- claim (the audit hands back one claim it knows is lost, never a newer one). A run cut
-- off this way may have reached its target: the attempt is written into the Plan's
-- history as interrupted (with the host that ran it). (A Life's Plans are handed back
-- through `inflight`: shard_release.lua.) The caller removes moved Plans from `held`.
-- A queue task that runs again keeps its earlier attempts: the `last_run` a run replaces
-- (a retry, a failure, a run cut off by a crash) goes into the task's hash as `run:{n}`
-- (`run_seq` counts them), the last TASK_RUNS_KEPT of them.
local TASK_RUNS_KEPT = 9
local function keep_previous_run(pk)
  local prev = redis.call('HGET', pk, 'last_run')
  if not prev then return end
  local n = redis.call('HINCRBY', pk, 'run_seq', 1)
  redis.call('HSET', pk, 'run:' .. n, prev)
  if n > TASK_RUNS_KEPT then redis.call('HDEL', pk, 'run:' .. (n - TASK_RUNS_KEPT)) end
end

local function hand_back(plan_id, notify_before_ms, running_before_ms, claim)
  local pk, pn = plan_of(plan_id)
  local f = redis.call('HMGET', pk, pn.state, pn.lease_owner, pn.fire_at_ms, pn.started_at_ms,
    pn.claims, pn.attempts)
  if f[1] == 'Running' and running_before_ms
      and tonumber(f[4] or 0) >= tonumber(running_before_ms) then
    return -1
  end
  if claim and f[5] ~= claim then return 0 end
  local host = f[2] or '?'
  if f[1] == 'Preset' or f[1] == 'Running' then
    local queue = task_queue(plan_id)
    if f[1] == 'Running' then
      local now_ms = redis_now_ms()
      local err = 'host ' .. host .. ' stopped (crashed or lost its lease) while this ran; it may have reached its target, and runs again'
      redis.call('HSET', pk, pn.state, 'Standby', pn.last_error, err, pn.interrupted, 1)
      local attempt = tonumber(f[6]) or 1
      local word = string.match(plan_id, ':(%a+)$')
      local record = cjson.encode({plan = word, attempt = attempt,
        should_run_at = tonumber(f[3]), started_at = tonumber(f[4]),
        duration_ms = math.max(now_ms - (tonumber(f[4]) or now_ms), 0), host = host,
        outcome = 'interrupted', error = err})
      if queue then
        -- A queue task's run no longer counts against its queue's max_concurrent.
        leave_running(queue, plan_id .. '#' .. f[5], notify_before_ms)
        keep_previous_run(pk)
        redis.call('HSET', pk, pn.last_run, record)
      else
        redis.call('LPUSH', PREFIX .. 'timer:' .. string.sub(plan_id, 1, -7) .. ':runs', record)
      end
      -- Rare (a crash or a lost lease): into the stream when the operator keeps one.
      if redis.call('EXISTS', PREFIX .. 'runs') == 1 then
        add_run(PREFIX .. 'runs', '100000', 'plan', plan_id, 'outcome', 'interrupted',
          'record', record)
      end
    else
      redis.call('HSET', pk, pn.state, 'Standby')
    end
    redis.call('HDEL', pk, pn.lease_owner)
    if queue then
      redis.call('ZADD', PREFIX .. 'due_tasks', f[3], plan_id)
    else
      redis.call('ZADD', PREFIX .. 'timers_due', f[3], plan_id)
    end
    notify_if_soon(f[3], notify_before_ms)
    return 1
  end
  return 0
end

-- Whether this host already applied the outcome of this claim's run (a retried call
-- whose first reply was lost): finish scripts mark the Plan with `done_by` = host#claim.
local function applied_by(plan_id, host, claim)
  local pk, pn = plan_of(plan_id)
  return redis.call('HGET', pk, pn.done_by) == host .. '#' .. claim
end

-- What the record REC of an `Idempotency-Key` says of a call with the request
-- fingerprint FP: nil when there is none; {'reused'} (another request's key),
-- {'replay', status, body}, {'in_progress'} (a call under way, begun less than
-- PENDING_MS ago), or {'stale'} (begun long ago, its answer never recorded: the host
-- making it died). Redis's clock is read only for a pending record.
local function idem_lookup(rec, fp, pending_ms)
  local r = redis.call('HMGET', rec, 'fp', 'state', 'status', 'body', 'at_ms')
  if not r[1] then return nil end
  if r[1] ~= fp then return {'reused'} end
  if r[2] == 'done' then return {'replay', r[3], r[4]} end
  if redis_now_ms() - tonumber(r[5] or 0) < tonumber(pending_ms) then return {'in_progress'} end
  return {'stale'}
end

-- ---------------------------------------------------------------------------------------
-- Layout 4: records, trees, inflight (docs/redis-layout.md)
-- ---------------------------------------------------------------------------------------

-- Records. A Life is one compact JSON value (the host builds it: store/record/), the
-- field `{uuid}` of one of the shard's record buckets `r:{n}`, hashes that stay in Redis's
-- compact listpack encoding. Buckets are found by linear hashing over the first 32 bits
-- of the id's SHA-1: `rn` says how many there are; a bucket that grows past
-- RECORDS_SPLIT_AT makes the next bucket in turn split in two, so that buckets keep about
-- 25 to 50 records on average however many the shard holds (small, so that a record is
-- found and rewritten in a short listpack).
local RECORDS_SPLIT_AT = 48
-- Each shard's bucket count, read once a call (a call of bookings, or a page, moves
-- between shards: `enter_shard`).
local record_counts = {}

local function record_buckets()
  local n = record_counts[PREFIX]
  if not n then
    n = tonumber(redis.call('GET', PREFIX .. 'rn')) or 1
    record_counts[PREFIX] = n
  end
  return n
end

-- The last id's key: a script that reads a record and writes it back hashes the id once.
local last_record_id, last_record_key, last_record_n, last_record_h = nil, nil, nil, nil

-- ID's bucket key; H is its hash (id_hash) when the caller knows it (the host sends it to
-- finish_life), else worked out here, once for a run of calls about the same id.
local function record_key_hashed(id, h)
  local n = record_buckets()
  if id ~= last_record_id or n ~= last_record_n then
    last_record_id, last_record_n, last_record_h = id, n, h or id_hash(id)
    -- The bucket number formatted as an integer: a number concatenated as it is is
    -- formatted as a double (`%.14g`), which costs Redis several times more.
    last_record_key = PREFIX .. 'r:' .. int_arg(bucket_index(last_record_h, n))
  end
  return last_record_key
end

local function record_key(id) return record_key_hashed(id, nil) end

-- ID's hash (id_hash), kept with its key for the record that follows.
local function record_hash(id)
  record_key(id)
  return last_record_h
end

-- Whether a booking of ID checks the sizes of its record's bucket and of its tree leaves
-- (a quarter of bookings do, by two bits of the id's hash that place nothing: bucket
-- numbers take its low bits). Each check is a command, and a booking pays per command;
-- a bucket splits past 48 of the listpack's 128 entries and a leaf sampled so past
-- TREE_LEAF_SAMPLED, so that 80 inserts in a row unchecked (one chance in ten billion)
-- are needed to outgrow the listpack between two checks.
local function booking_checks(id)
  return math.floor(record_hash(id) / 16777216) % 4 == 0
end

local function get_record(id)
  return redis.call('HGET', record_key(id), id)
end

-- Splits the next bucket in turn of a family of buckets (`r:` the Lives', `t:` the
-- pending queue tasks', each with its count key, `rn` / `tn`, and COUNTS, the counts
-- read this call): bucket N - P gives the members whose hash mod 2P is N to the new
-- bucket N.
local function split_buckets(family, count_key, counts, n)
  local p = 1
  while p * 2 <= n do p = p * 2 end
  local from_key, to_key = PREFIX .. family .. (n - p), PREFIX .. family .. n
  local all = redis.call('HGETALL', from_key)
  local moved, gone = {}, {}
  for i = 1, #all, 2 do
    if id_hash(all[i]) % (p * 2) == n then
      moved[#moved + 1] = all[i]
      moved[#moved + 1] = all[i + 1]
      gone[#gone + 1] = all[i]
    end
  end
  if #gone > 0 then
    redis.call('HSET', to_key, unpack(moved))
    redis.call('HDEL', from_key, unpack(gone))
  end
  counts[PREFIX] = n + 1
  redis.call('SET', PREFIX .. count_key, string.format('%d', n + 1))
end

local function split_records()
  split_buckets('r:', 'rn', record_counts, record_buckets())
end

-- A record was added to bucket KEY: past RECORDS_SPLIT_AT, the next bucket in turn splits.
local function record_added(key)
  if redis.call('HLEN', key) > RECORDS_SPLIT_AT then split_records() end
end

-- Writes the record of a new Life: false, writing nothing, when one is there already.
-- One HSETNX where a look and a write took two commands. CHECK false: the bucket's size
-- is not looked at (a booking not sampled, booking_checks).
local function put_new_record(id, rec, check)
  local key = record_key(id)
  if redis.call('HSETNX', key, id, rec) == 0 then return false end
  if check ~= false then record_added(key) end
  return true
end

local function put_record(id, rec)
  local key = record_key(id)
  if redis.call('HSET', key, id, rec) == 1 then record_added(key) end
end

-- A script that reads or writes many shards of one standalone Redis (a page of the
-- listing, a call of bookings) moves from shard to shard: PREFIX and the record buckets
-- become the shard's.
local function enter_shard(prefix)
  PREFIX = prefix
  last_record_id = nil
end

local function del_record(id)
  redis.call('HDEL', record_key(id), id)
end

-- The header of a record: its first scalars, in the order store/record/ writes them
-- (`s` state, `b` birth, `d` death, `r` resource), read with patterns that never reach
-- the actions or the history after them.
local function record_head(rec)
  local head = string.match(rec, '^(.-)"a":') or rec
  return {
    state = string.match(head, '^{"s":"(%a+)"') or 'Inexistent',
    birth_ms = tonumber(string.match(head, '"b":(%-?%d+)')),
    death_ms = tonumber(string.match(head, '"d":(%-?%d+)')),
    resource_id = string.match(head, '"r":"(.-)","c":'),
  }
end

-- Trees. A large sorted set is kept as leaves of at most TREE_LEAF_MAX members, each a
-- sorted set of its own, `{tree}:{leaf id}`: small enough for Redis's listpack encoding,
-- where a member costs its bytes and a few more instead of a skiplist node and a dict
-- entry (about 50 bytes instead of 140 for a Plan id and its time). The tree's own key is
-- an index of its leaves: a sorted set whose scores are all 0 and whose members,
-- `{score, 13 digits}:{member}|{leaf id}`, name the least (score, member) each leaf
-- holds, so that ZREVRANGEBYLEX finds a member's leaf (the first leaf's bound is
-- `0000000000000:`). Scores are times in ms. A leaf that outgrows TREE_LEAF_MAX splits
-- in two halves, or, when the member added is the tree's last (bookings made in the
-- order of their times), leaves the full leaf as it is and begins a new one with that
-- member; a leaf left empty is dropped (the first stays).
-- Leaves are small because Redis looks a member up in a listpack one entry after the
-- other, twice an insert (is it there, where does it go): a ZADD into a leaf of 100
-- members cost ~11 µs of Redis time on a slow VM, against ~3 µs into one of 30.
local TREE_LEAF_MAX = 64
local TREE_LEAF_SAMPLED = 48
local TREE_FIRST = '0000000000000:'

-- Whether A sorts before or equal to B byte by byte (as Redis orders members; Lua's own
-- string comparison follows the locale).
local function bytes_le(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end

local function tree_bound(score, member)
  return string.format('%013d', tonumber(score)) .. ':' .. member
end

local function leaf_id_of(entry) return string.match(entry, '|(%d+)$') end

-- The index entry of the leaf that (SCORE, MEMBER) belongs in, or nil (an empty tree).
local function tree_entry(tree, score, member)
  local r = redis.call('ZREVRANGEBYLEX', tree, '[' .. tree_bound(score, member) .. '|~', '-',
    'LIMIT', '0', '1')
  return r[1]
end

-- The leaf key for (SCORE, MEMBER), made with the tree if there is none: key, entry.
local function tree_leaf(tree, score, member)
  local entry = tree_entry(tree, score, member)
  if not entry then
    entry = TREE_FIRST .. '|' .. redis.call('INCR', PREFIX .. 'tseq')
    redis.call('ZADD', tree, 0, entry)
  end
  return tree .. ':' .. leaf_id_of(entry), entry
end

-- Splits LEAF (index entry ENTRY), which (SCORE, MEMBER) was just added to: the members
-- from rank FROM on move to a new leaf, bound in the index by the first of them.
local function tree_split(tree, leaf, entry, score, member)
  local moved, from
  if redis.call('ZRANGE', leaf, -1, -1)[1] == member
      and not redis.call('ZRANGEBYLEX', tree, '(' .. entry, '+', 'LIMIT', '0', '1')[1] then
    -- Appended to the last leaf: the leaves before it would stay half full for good.
    -- The member begins the next leaf, and nothing else moves.
    moved, from = {score, member}, -1
  else
    local items = redis.call('ZRANGE', leaf, 0, -1, 'WITHSCORES')
    local n = #items / 2
    local cut = math.floor(n / 2) + 1
    moved, from = {}, cut - 1
    for i = cut, n do
      moved[#moved + 1] = items[2 * i]
      moved[#moved + 1] = items[2 * i - 1]
    end
  end
  local id = redis.call('INCR', PREFIX .. 'tseq')
  for i = 1, #moved, 200 do
    redis.call('ZADD', tree .. ':' .. id, unpack(moved, i, math.min(i + 199, #moved)))
  end
  redis.call('ZREMRANGEBYRANK', leaf, from, -1)
  redis.call('ZADD', tree, 0, tree_bound(moved[1], moved[2]) .. '|' .. id)
end

-- SAMPLED (a booking, booking_checks): nil checks the leaf's size after the insert,
-- against TREE_LEAF_MAX; true checks it against TREE_LEAF_SAMPLED; false does not.
local function tree_add(tree, score, member, sampled)
  local leaf, entry = tree_leaf(tree, score, member)
  if redis.call('ZADD', leaf, score, member) == 1 and sampled ~= false then
    local max = sampled and TREE_LEAF_SAMPLED or TREE_LEAF_MAX
    if redis.call('ZCARD', leaf) > max then tree_split(tree, leaf, entry, score, member) end
  end
end

-- Drops a leaf left empty, unless it is the first.
local function tree_prune(tree, leaf, entry)
  if string.sub(entry, 1, #TREE_FIRST) ~= TREE_FIRST and redis.call('EXISTS', leaf) == 0 then
    redis.call('ZREM', tree, entry)
  end
end

local function tree_rem(tree, score, member)
  local entry = tree_entry(tree, score, member)
  if not entry then return 0 end
  local leaf = tree .. ':' .. leaf_id_of(entry)
  local removed = redis.call('ZREM', leaf, member)
  if removed == 1 then tree_prune(tree, leaf, entry) end
  return removed
end

-- Reads LEAF's members from score FROM to TO (ZRANGEBYSCORE, or ZREVRANGEBYSCORE when
-- DESC) into OUT, {member, score, ...}, until OUT holds LIMIT, leaving out those at FROM
-- up to CURSOR going up, down to it going down (CURSOR '': none): whether OUT is full.
-- A leaf is read in pieces of what the page still lacks (and one more for the member at
-- the cursor, skipped), not whole: it holds up to TREE_LEAF_MAX members and each one
-- read costs the Lua bridge.
local function leaf_read(out, leaf, from, to, cursor, limit, desc)
  local command = desc and 'ZREVRANGEBYSCORE' or 'ZRANGEBYSCORE'
  local offset = 0
  while true do
    local want = limit - #out / 2 + 1
    local items = redis.call(command, leaf, from, to, 'WITHSCORES', 'LIMIT', int_arg(offset),
      int_arg(want))
    for i = 1, #items, 2 do
      local skip = false
      if cursor ~= '' and tonumber(items[i + 1]) == tonumber(from) then
        if desc then skip = bytes_le(cursor, items[i]) else skip = bytes_le(items[i], cursor) end
      end
      if not skip then
        out[#out + 1] = items[i]
        out[#out + 1] = items[i + 1]
        if #out / 2 >= limit then return true end
      end
    end
    if #items / 2 < want then return false end
    offset = offset + #items / 2
  end
end

-- Up to LIMIT {member, score, ...} of TREE from (MIN, AFTER) (exclusive; AFTER '' for
-- every member at MIN) to score MAX (a number or '+inf'), in (score, member) order.
local function tree_range(tree, min, after, max, limit)
  local out = {}
  if limit <= 0 then return out end
  local entry
  if after == '' then
    -- Every member at MIN: the leaf before the first bound at MIN or past it (a leaf
    -- may begin at (MIN, m) with members at MIN below m in the leaf before).
    entry = redis.call('ZREVRANGEBYLEX', tree, '(' .. tree_bound(min, ''), '-', 'LIMIT', '0', '1')[1]
  else
    entry = tree_entry(tree, min, after)
  end
  if not entry then
    local first = redis.call('ZRANGE', tree, 0, 0)
    entry = first[1]
    if not entry then return out end
  end
  while entry do
    if leaf_read(out, tree .. ':' .. leaf_id_of(entry), min, max, after, limit, false) then
      return out
    end
    local nxt = redis.call('ZRANGEBYLEX', tree, '(' .. entry, '+', 'LIMIT', '0', '1')[1]
    if not nxt or (max ~= '+inf' and tonumber(string.sub(nxt, 1, 13)) > tonumber(max)) then
      return out
    end
    entry = nxt
  end
  return out
end

-- Up to LIMIT {member, score, ...} of TREE below (MAX, BEFORE) (exclusive; BEFORE '' for
-- every member at MAX; MAX '+inf' for the last) down to score MIN, in descending
-- (score, member) order: the leaves from the one that holds the start, backwards.
local function tree_rev_range(tree, max, before, min, limit)
  local out = {}
  if limit <= 0 then return out end
  local entry
  if max == '+inf' then
    entry = redis.call('ZRANGE', tree, -1, -1)[1]
  elseif before == '' then
    -- The leaf of the first member past every one at MAX.
    entry = tree_entry(tree, tonumber(max) + 1, '')
  else
    entry = tree_entry(tree, max, before)
  end
  local lo = tonumber(min)
  while entry do
    if leaf_read(out, tree .. ':' .. leaf_id_of(entry), max, min, before, limit, true) then
      return out
    end
    -- Every leaf before this one holds members below this one's first.
    if tonumber(string.sub(entry, 1, 13)) < lo then return out end
    entry = redis.call('ZREVRANGEBYLEX', tree, '(' .. entry, '-', 'LIMIT', '0', '1')[1]
  end
  return out
end

-- Takes up to LIMIT members scored up to MAX off the front of TREE: {member, score, ...}.
-- The index is read 16 leaves at a time until LIMIT is reached: leaves split in halves
-- hold 32 to 64 members, and a claim that came back short of its batch would tell the
-- host that nothing more is due.
local function tree_take(tree, max, limit)
  local out, n = {}, 0
  if limit <= 0 then return out end
  local from, max_ms = '-', tonumber(max)
  while true do
    local entries = redis.call('ZRANGEBYLEX', tree, from, '+', 'LIMIT', '0', '16')
    for _, entry in ipairs(entries) do
      if tonumber(string.sub(entry, 1, 13)) > max_ms then return out end
      local leaf = tree .. ':' .. leaf_id_of(entry)
      local items = redis.call('ZRANGEBYSCORE', leaf, '-inf', max, 'WITHSCORES',
        'LIMIT', '0', int_arg(limit - n / 2))
      local got = #items
      if got > 0 then
        for j = 1, got do out[n + j] = items[j] end
        n = n + got
        -- What was read is the leaf's first members by rank: dropped by rank, without
        -- sending their names back (a ZREM looks each one up in the leaf).
        redis.call('ZREMRANGEBYRANK', leaf, '0', int_arg(got / 2 - 1))
        tree_prune(tree, leaf, entry)
      end
      if n / 2 >= limit then return out end
    end
    if #entries < 16 then return out end
    from = '(' .. entries[#entries]
  end
end

-- The first {member, score} of TREE, or an empty table.
local function tree_first(tree)
  for _, entry in ipairs(redis.call('ZRANGEBYLEX', tree, '-', '+', 'LIMIT', '0', '16')) do
    local first = redis.call('ZRANGE', tree .. ':' .. leaf_id_of(entry), 0, 0, 'WITHSCORES')
    if first[1] then return first end
  end
  return {}
end

-- Members of TREE.
local function tree_count(tree)
  local n = 0
  for _, entry in ipairs(redis.call('ZRANGE', tree, 0, -1)) do
    n = n + redis.call('ZCARD', tree .. ':' .. leaf_id_of(entry))
  end
  return n
end

-- Deletes TREE and its leaves.
local function tree_delete(tree)
  for _, entry in ipairs(redis.call('ZRANGE', tree, 0, -1)) do
    redis.call('DEL', tree .. ':' .. leaf_id_of(entry))
  end
  redis.call('DEL', tree)
end

-- Inflight: the shard's `inflight` hash holds each Life Plan claimed by the shard's
-- owner, `{claim}|{fire_ms}|{host}`, and once it runs `...|{started_ms}|{attempt}`. A
-- Plan is Standby in the due tree, Preset or Running here, or finished in its record.
local function inflight_key() return PREFIX .. 'inflight' end

-- Whether the `inflight` entry V (nil: none) is CLAIM's under HOST. Checked in place, with
-- no part of it cut out: every string.sub makes a string, which Redis's Lua hashes byte
-- by byte, and the hot scripts check an entry per Plan. Returns, when it is, the first
-- bar's position (the fire time follows it) and, once the Plan runs, the position of the
-- bar before its start time (nil while Preset).
local function inflight_holds(v, claim, host)
  if not v then return nil end
  local a = string.find(v, '|', 1, true)
  if a ~= #claim + 1 or string.find(v, claim, 1, true) ~= 1 then return nil end
  local b = string.find(v, '|', a + 1, true)
  if not b or string.find(v, host, b + 1, true) ~= b + 1 then return nil end
  local c = b + 1 + #host
  if c > #v then return a, nil end
  if string.byte(v, c) ~= 124 then return nil end
  return a, c
end

-- Finished Lives: the shard's `finished` list, `{finish ms, 13 digits}:{uuid}` in the
-- order they finished (oldest first, as far as the hosts' clocks agree), appended to in
-- one RPUSH a call and taken from its head by the sweep.
local function finished_entry(ms, uuid)
  return string.format('%013d', tonumber(ms)) .. ':' .. uuid
end

local function inflight_parse(v)
  if not v then return nil end
  local claim, fire, host, started, attempt =
    string.match(v, '^([^|]*)|([^|]*)|([^|]*)|?([^|]*)|?([^|]*)$')
  return {claim = claim, fire_ms = tonumber(fire), host = host,
    started_ms = tonumber(started), attempt = tonumber(attempt),
    running = started ~= nil and started ~= ''}
end

-- Notes that a Life's record changed while one of its Plans is claimed or running, so
-- that the run's finish reads the record anew instead of writing the one it was given.
local function touch_if_inflight(uuid)
  local f = redis.call('HMGET', inflight_key(), uuid .. ':birth', uuid .. ':death')
  if f[1] or f[2] then redis.call('SADD', PREFIX .. 'touched', uuid) end
end

-- The first other Life on the resource whose [birth, death or birth] span meets
-- [lo, hi], counting only Lives still pending or alive; false when there is none.
local function resource_conflict(res_key, lo, hi, exclude)
  local ids = redis.call('ZRANGEBYSCORE', res_key, '-inf', hi)
  for _, id in ipairs(ids) do
    if id ~= exclude then
      local rec = get_record(id)
      if rec then
        local h = record_head(rec)
        if (h.state == 'Inexistent' or h.state == 'Alive')
            and (h.death_ms or h.birth_ms) >= lo then
          return id
        end
      end
    end
  end
  return false
end

-- Books a Life and its Plans, or nothing (the body of book.lua, for each of its
-- bookings, and of book_idem.lua). The host built its record (store/record/). Every key
-- is the shard's (PREFIX): its trees, the resource's index and order, the plugins' sets.
-- UUID, RID ('' = none), BIRTH and DEATH (ms as text, DEATH '' for a point), REC (the
-- record), GUARD and NOTIFY_BEFORE (ms), PLUGINS (the names the actions use) and
-- LOOK_FOR_POINTER ('1', or '' where no pointer can stand: outside the id's home shard,
-- or an id the host drew for this booking) as book_argv reads them. Times go to Redis
-- as the text they came as: a Lua number would be printed anew (`%.17g`) at every
-- command.
-- Returns {'ok'} | {'resource_conflict', other_uuid} | {'duplicate'} |
--   {'pointer', value}: this is the id's home shard and it points to another shard
--   (the Life is there, or was, or is being booked there)
local function book_life(uuid, rid, birth, death, rec, guard, notify_before, plugins,
    look_for_pointer)
  local birth_ms, death_ms = tonumber(birth), tonumber(death)
  local res_key = PREFIX .. 'resource:' .. rid
  if rid ~= '' then
    local g = tonumber(guard)
    local other = resource_conflict(res_key, birth_ms - g, (death_ms or birth_ms) + g, uuid)
    if other then return {'resource_conflict', other} end
  end
  -- A pointer here says the Life is booked in another shard (or was being booked
  -- there): the host looks whether it is stale. Else a record here is a duplicate.
  if look_for_pointer ~= '' then
    local pointer = redis.call('GET', PREFIX .. 'ptr:' .. uuid)
    if pointer then return {'pointer', pointer} end
  end
  local check = booking_checks(uuid)
  if not put_new_record(uuid, rec, check) then return {'duplicate'} end
  if rid ~= '' then
    redis.call('ZADD', res_key, birth, uuid)
    redis.call('ZADD', order_key(rid), birth, uuid .. ':birth')
    -- The death Plan waits outside the due tree until birth is done (finish_life adds
    -- it), but holds its place in the resource's order from now.
    if death_ms then redis.call('ZADD', order_key(rid), death, uuid .. ':death') end
  end
  census(nil, 'Inexistent')
  tree_add(PREFIX .. 'due', birth, uuid .. ':birth', check)
  tree_add(PREFIX .. 'lives', birth, uuid, check)
  for _, name in ipairs(plugins) do redis.call('SADD', PREFIX .. 'plugin-lives:' .. name, uuid) end
  notify_if_soon(birth, notify_before)
  return {'ok'}
end

-- Reads the booking whose arguments begin at ARGV[A] (store/lives.rs `book_args`: prefix,
-- uuid, resource_id, birth_ms, death_ms, record, guard_ms, notify_before_ms, whether to
-- look for a pointer, the count of plugins and their names) and enters its shard:
-- book_life's arguments as a table, and where the next arguments begin.
local function book_argv(a)
  enter_shard(ARGV[a])
  local plugins = {}
  for i = 1, tonumber(ARGV[a + 9]) do plugins[i] = ARGV[a + 9 + i] end
  return {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6],
    ARGV[a + 7], plugins, ARGV[a + 8]}, a + 10 + #plugins
end

-- Books the callback of a Plan that finished for good (model::Callbacks): a point Life
-- `uuid` due at once in this shard (the host drew the id to have this shard as its home,
-- and built its record). Nothing when the Life exists (a finish written twice).
-- PLUGINS: the plugin names its action uses, separated by spaces.
local function book_callback(uuid, record, plugins, now_ms, notify_before_ms)
  if uuid == '' or not put_new_record(uuid, record) then return end
  census(nil, 'Inexistent')
  tree_add(PREFIX .. 'due', now_ms, uuid .. ':birth')
  tree_add(PREFIX .. 'lives', now_ms, uuid)
  for name in string.gmatch(plugins, '%S+') do
    redis.call('SADD', PREFIX .. 'plugin-lives:' .. name, uuid)
  end
  notify_if_soon(now_ms, notify_before_ms)
end

-- book_callback for a timer's or a queue task's run: the callback's plugin, if any, is
-- read from its record (rare: a callback is mostly a webhook).
local function book_callback_record(uuid, record, now_ms, notify_before_ms)
  if uuid == '' then return end
  local plugins = ''
  if string.find(record, '"plugin"', 1, true) then
    local a = cjson.decode(record).a
    if type(a) == 'table' and type(a.plugin) == 'string' then
      plugins = string.match(a.plugin, '^[^@]+')
    end
  end
  book_callback(uuid, record, plugins, now_ms, notify_before_ms)
end

-- Members of TREE scored up to MAX.
local function tree_count_until(tree, max)
  local n = 0
  for _, entry in ipairs(redis.call('ZRANGEBYLEX', tree, '-', '+')) do
    if tonumber(string.sub(entry, 1, 13)) > tonumber(max) then break end
    n = n + redis.call('ZCOUNT', tree .. ':' .. leaf_id_of(entry), '-inf', max)
  end
  return n
end

-- task_get: queue tasks as their Plan hashes' fields, whichever way each is stored: a
-- pending task's record (task_records.lua) reads as the hash it becomes.
-- KEYS: 1 the queue (for routing: every task of a queue is in its shard)
-- ARGV: 1 prefix, 2 queue, then task names
-- Returns per task its {field, value, ...}, empty for none.
local out = {}
for i = 3, #ARGV do
  local plan_id = ARGV[2] .. '/' .. ARGV[i] .. ':task'
  local fields = redis.call('HGETALL', plan_key(plan_id))
  if #fields == 0 then
    local rec = get_task_record(plan_id)
    if rec then fields = task_record_fields(rec) end
  end
  out[#out + 1] = fields
end
return out

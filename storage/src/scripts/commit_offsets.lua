-- A plain offset commit (OffsetCommit) of a group whose keys share a hash
-- slot: the offsets, each with the order number of the group's last
-- transactional stage (offset_order.lua), so that a transaction that staged
-- an offset of the partition before this commit does not overwrite it when
-- it commits.
--
-- KEYS[1] ketch:group:{G}:offsets
-- KEYS[2] ketch:group:{G}:txn-offsets (its 'order' field, written back
--         when it had to be rebuilt from the offsets staged)
-- ARGV    '<topic>:<partition>', offset JSON pairs
local order = current_order(KEYS[2])
if order > 0 then
  order = string.format('%d', order)
  redis.call('HSET', KEYS[2], 'order', order)
else
  order = nil
end
local committed = 0
for i = 1, #ARGV, 2 do
  local json = ARGV[i + 1]
  if order then
    json = with_order(json, order)
  end
  redis.call('HSET', KEYS[1], ARGV[i], json)
  committed = committed + 1
end
return committed

-- Deletes the committed offsets of some partitions of a group that were
-- committed at or before a time (offset expiry, one partition at a time).
-- Each offset's commit time is read again here, so one committed again
-- since the caller read it stays; so does one an open transaction has
-- staged a new offset for (Kafka keeps an offset with pending
-- transactional offsets).
--
-- KEYS[1] ketch:group:{G}:offsets (`<topic>:<partition>` -> JSON with commit_ms)
-- KEYS[2] (absent for a group id starting with `}`, which no transaction
--         commits offsets of) ketch:group:{G}:txn-offsets, fields
--         `<topic>:<partition>:<producer id>` (and `applied`)
-- ARGV[1] the newest commit time that expires (ms)
-- ARGV[2..] the partitions' fields
-- Returns how many offsets were deleted.
local cutoff = tonumber(ARGV[1])
local staged = {}
if KEYS[2] then
  for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
    local partition = string.match(field, '^(.*):[^:]*$')
    if partition then
      staged[partition] = true
    end
  end
end
local deleted = 0
for i = 2, #ARGV do
  local json = redis.call('HGET', KEYS[1], ARGV[i])
  if json and not staged[ARGV[i]] then
    local ok, offset = pcall(cjson.decode, json)
    if ok and type(offset) == 'table' and tonumber(offset.commit_ms)
        and tonumber(offset.commit_ms) <= cutoff then
      deleted = deleted + redis.call('HDEL', KEYS[1], ARGV[i])
    end
  end
end
return deleted

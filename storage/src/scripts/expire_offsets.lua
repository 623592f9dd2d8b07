-- Deletes the committed offsets of some partitions of a group that were
-- committed at or before a time (offset expiry, one partition at a time).
-- Each offset's commit time is read again here, so one committed again
-- since the caller read it stays.
--
-- KEYS[1] ketch:group:{G}:offsets (`<topic>:<partition>` -> JSON with commit_ms)
-- ARGV[1] the newest commit time that expires (ms)
-- ARGV[2..] the partitions' fields
-- Returns how many offsets were deleted.
local cutoff = tonumber(ARGV[1])
local deleted = 0
for i = 2, #ARGV do
  local json = redis.call('HGET', KEYS[1], ARGV[i])
  if json then
    local ok, offset = pcall(cjson.decode, json)
    if ok and type(offset) == 'table' and tonumber(offset.commit_ms)
        and tonumber(offset.commit_ms) <= cutoff then
      deleted = deleted + redis.call('HDEL', KEYS[1], ARGV[i])
    end
  end
end
return deleted

-- Deletes the committed offsets of some partitions of a group that expired
-- (offset expiry, one partition at a time): an offset whose commit set its
-- own expiry time (`expire_ms`, OffsetCommit v2-v4) when that has come,
-- any other if it was committed at or before a time. Each offset is read
-- again here, so one committed again since the caller read it stays; so
-- does one an open transaction has staged a new offset for (Kafka keeps an
-- offset with pending transactional offsets).
--
-- KEYS[1] ketch:group:{G}:offsets (`<topic>:<partition>` -> JSON with commit_ms)
-- KEYS[2] (absent for a group id starting with `}`, which no transaction
--         commits offsets of) ketch:group:{G}:txn-offsets, fields
--         `<topic>:<partition>:<producer id>` (and `applied`)
-- ARGV[1] the newest commit time that expires (ms; of an offset without
--         an expiry time of its own)
-- ARGV[2] now (ms): an offset whose expiry time is at or before it expires
-- ARGV[3..] the partitions' fields
-- Returns how many offsets were deleted.
local cutoff = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
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
for i = 3, #ARGV do
  local json = redis.call('HGET', KEYS[1], ARGV[i])
  if json and not staged[ARGV[i]] then
    local ok, offset = pcall(cjson.decode, json)
    local expired = false
    if ok and type(offset) == 'table' then
      local expire_ms = tonumber(offset.expire_ms)
      local commit_ms = tonumber(offset.commit_ms)
      if expire_ms then
        expired = expire_ms <= now
      else
        expired = commit_ms ~= nil and commit_ms <= cutoff
      end
    end
    if expired then
      deleted = deleted + redis.call('HDEL', KEYS[1], ARGV[i])
    end
  end
end
return deleted

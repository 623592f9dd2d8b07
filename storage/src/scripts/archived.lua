-- Records that a sealed segment is in the archive.
--
-- KEYS[1] ketch:{TAG}:segments  (see seal.lua)
-- ARGV[1] the segment's base offset   ARGV[2] its last offset
-- ARGV[3] the data file's path        ARGV[4] the data file's size in bytes
--
-- Reply: 1 when recorded (or already recorded), 0 when the segment is gone
-- (deleted by DeleteRecords or the topic deleted meanwhile).
local found = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[1], 'BYSCORE')
for _, member in ipairs(found) do
  local segment = cjson.decode(member)
  if segment.last == tonumber(ARGV[2]) then
    if segment.path then
      return 1
    end
    segment.path = ARGV[3]
    segment.file_bytes = tonumber(ARGV[4])
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZADD', KEYS[1], segment.base, cjson.encode(segment))
    return 1
  end
end
return 0

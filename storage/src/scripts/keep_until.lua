-- Notes that some committed offset of a group must be kept until a time
-- (an OffsetCommit v2–v4 that set `retention_time_ms`): the group's keys,
-- once it has no members, expire no earlier (retain_group.lua). The key
-- holds the latest such time and expires at it; it only ever moves later.
--
-- KEYS[1] ketch:group:{G}:keep-until
-- ARGV[1] the time (ms since the Unix epoch)
-- Returns 1 if it moved later.
local wanted = tonumber(ARGV[1])
local kept = tonumber(redis.call('GET', KEYS[1]))
if kept and kept >= wanted then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[1])
return 1

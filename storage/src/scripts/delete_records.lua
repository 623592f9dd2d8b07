-- Moves a partition's log start offset forward (DeleteRecords) and trims
-- the stream entries that lie wholly below it.
--
-- KEYS[1] ketch:{TAG}:meta
-- KEYS[2] ketch:{TAG}:log
-- KEYS[3] ketch:{TAG}:times
-- KEYS[4] ketch:{TAG}:clean   the compacted part of a compacted topic's log
-- ARGV[1] the new log start offset; -1 means the high watermark
-- ARGV[2] the partition's wake-up channel: told '<next offset> <log start>'
--         when the log start moved (gateways drop what they keep of the
--         partition's tail below it: tail.rs)
--
-- Reply: {0, low_watermark} on success, {-1} when the partition does not
-- exist, {-2, high_watermark} when the offset is past the high watermark.
local meta = redis.call('HMGET', KEYS[1], 'next_offset', 'log_start', 'local_start')
if not meta[1] then
  return {-1}
end
local hw = tonumber(meta[1])
local start = tonumber(meta[2])
local target = tonumber(ARGV[1])
if target == -1 then
  target = hw
end
if target < 0 or target > hw then
  return {-2, hw}
end
if target > start then
  -- With tiered storage the local start can be ahead of the log start
  -- (archived segments trimmed from Redis); it never moves back.
  local local_start = math.max(tonumber(meta[3] or meta[2]), target)
  redis.call('HSET', KEYS[1], 'log_start', string.format('%d', target), 'local_start',
    string.format('%d', local_start))
  -- Entry ids are <last_offset>-<count>: MINID removes batches whose last offset is below target.
  redis.call('XTRIM', KEYS[2], 'MINID', string.format('%d', target))
  redis.call('XTRIM', KEYS[4], 'MINID', string.format('%d', target))
  start = target
  if ARGV[2] then
    redis.call('SPUBLISH', ARGV[2], string.format('%d %d', hw, start))
  end
end
return {0, start}

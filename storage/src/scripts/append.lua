-- Appends one record batch to a partition and assigns its offsets.
--
-- KEYS[1] ketch:{TAG}:meta   partition metadata hash (absent: no such partition)
-- KEYS[2] ketch:{TAG}:log    stream, one entry per batch, id <last_offset>-<record_count>
-- KEYS[3] ketch:{TAG}:times  sparse time index: score = running max timestamp, member = base offset
-- ARGV[1] the batch bytes, verbatim
-- ARGV[2] record count (>= 1, validated by the caller)
-- ARGV[3] the batch's max timestamp (ms)
-- ARGV[4] wake-up channel ketch:{TAG}:wake
-- ARGV[5] time index interval in bytes
--
-- Reply: {base_offset, log_start_offset}, or {-1} when the partition does not exist.
local meta = redis.call('HMGET', KEYS[1], 'next_offset', 'log_start', 'max_ts', 'idx_bytes', 'bytes')
if not meta[1] then
  return {-1}
end
local base = tonumber(meta[1])
local count = tonumber(ARGV[2])
local last = base + count - 1
local ts = tonumber(ARGV[3])
local size = string.len(ARGV[1])

redis.call('XADD', KEYS[2], string.format('%d-%d', last, count), 'b', ARGV[1], 't', ARGV[3])

local idx_bytes = tonumber(meta[4] or '0') + size
local max_ts = tonumber(meta[3] or '-1')
if ts > max_ts then
  redis.call('HSET', KEYS[1], 'max_ts', ARGV[3], 'max_ts_offset', string.format('%d', base))
  if max_ts < 0 or idx_bytes >= tonumber(ARGV[5]) then
    redis.call('ZADD', KEYS[3], ARGV[3], string.format('%d', base))
    idx_bytes = 0
  end
end
redis.call('HSET', KEYS[1], 'next_offset', string.format('%d', last + 1),
  'idx_bytes', string.format('%d', idx_bytes),
  'bytes', string.format('%d', tonumber(meta[5] or '0') + size))
redis.call('SPUBLISH', ARGV[4], string.format('%d', last + 1))
return {base, tonumber(meta[2])}

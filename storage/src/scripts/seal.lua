-- Seals a partition's open segment when it is full or old enough, and
-- applies retention to the sealed ones (topics without remote storage).
--
-- KEYS[1] ketch:{TAG}:meta      partition metadata (seg_base, seg_bytes, seg_start_ms, seg_max_ts)
-- KEYS[2] ketch:{TAG}:segments  sorted set: score = base offset, member = JSON
--                               {base, last, bytes, max_ts, sealed_ms}
-- KEYS[3] ketch:{TAG}:log       the stream
-- KEYS[4] ketch:{TAG}:producers idempotent producers' state (see append.lua)
-- ARGV[1] segment.bytes     ARGV[2] segment.ms
-- ARGV[3] retention.ms (-1: none)   ARGV[4] retention.bytes (-1: none)
-- ARGV[5] 1 to apply retention (no remote storage), 0 to keep everything
-- ARGV[6] producers.expiration in ms: producer state idle longer is dropped
--
-- Reply: {segments sealed, segments deleted, log start offset, producers
-- expired}, or {-1} when the partition does not exist.
local meta = redis.call('HMGET', KEYS[1], 'next_offset', 'log_start', 'seg_base', 'seg_bytes',
  'seg_start_ms', 'seg_max_ts')
if not meta[1] then
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local next_offset = tonumber(meta[1])
local log_start = tonumber(meta[2])
local seg_base = tonumber(meta[3] or '0')
local seg_bytes = tonumber(meta[4] or '0')

local sealed = 0
if seg_bytes > 0 and (seg_bytes >= tonumber(ARGV[1]) or now - tonumber(meta[5] or now) >= tonumber(ARGV[2])) then
  local segment = cjson.encode({base = seg_base, last = next_offset - 1, bytes = seg_bytes,
    max_ts = tonumber(meta[6] or '-1'), sealed_ms = now})
  redis.call('ZADD', KEYS[2], seg_base, segment)
  redis.call('HSET', KEYS[1], 'seg_base', string.format('%d', next_offset), 'seg_bytes', '0')
  redis.call('HDEL', KEYS[1], 'seg_start_ms', 'seg_max_ts')
  sealed = 1
  seg_bytes = 0
end

local deleted = 0
if ARGV[5] == '1' then
  local retention_ms = tonumber(ARGV[3])
  local retention_bytes = tonumber(ARGV[4])
  local segments = redis.call('ZRANGE', KEYS[2], 0, -1)
  local total = seg_bytes
  for _, s in ipairs(segments) do
    total = total + cjson.decode(s).bytes
  end
  local new_start = log_start
  for _, s in ipairs(segments) do
    local segment = cjson.decode(s)
    local expired = retention_ms >= 0 and segment.max_ts < now - retention_ms
    local oversize = retention_bytes >= 0 and total - segment.bytes >= retention_bytes
    -- Segments below the log start (DeleteRecords) go as well.
    if not (expired or oversize or segment.last < log_start) then
      break
    end
    redis.call('ZREM', KEYS[2], s)
    total = total - segment.bytes
    new_start = math.max(new_start, segment.last + 1)
    deleted = deleted + 1
  end
  if new_start > log_start then
    redis.call('HSET', KEYS[1], 'log_start', string.format('%d', new_start),
      'local_start', string.format('%d', new_start))
    redis.call('XTRIM', KEYS[3], 'MINID', string.format('%d', new_start))
    log_start = new_start
  end
end
-- Producer state idle past producers.expiration is forgotten, as Kafka
-- forgets it: the producer's next batch then starts over at sequence 0.
local expired = 0
local producers = redis.call('HGETALL', KEYS[4])
for i = 1, #producers, 2 do
  local ok, state = pcall(cjson.decode, producers[i + 1])
  if ok and type(state) == 'table' and (state.t or 0) < now - tonumber(ARGV[6]) then
    redis.call('HDEL', KEYS[4], producers[i])
    expired = expired + 1
  end
end
return {sealed, deleted, log_start, expired}

-- Ends a compaction pass: the stream it wrote becomes the partition's
-- compacted stream and `clean_end` moves to the end of what it compacted,
-- in one step; the old compacted stream is freed in the background
-- (UNLINK), so no step here takes time in proportion to the data. The log
-- below the new `clean_end` is trimmed afterwards, in bounded steps
-- (readers go to the compacted stream below `clean_end`).
--
-- KEYS[1] ketch:{TAG}:meta
-- KEYS[2] ketch:{TAG}:lease
-- KEYS[3] ketch:{TAG}:compacting   the stream the pass wrote (may not exist: nothing kept)
-- KEYS[4] ketch:{TAG}:clean        the compacted stream
-- KEYS[5] ketch:{TAG}:segments
-- KEYS[6] ketch:{TAG}:aborted      the aborted transactions index
-- ARGV[1] the worker's id, a space, the pass's token (compact_add.lua)
-- ARGV[2] `clean_end` as the pass read it ('' when there was none;
--         'abandon' gives the pass up: remote storage was turned on)
-- ARGV[3] the new `clean_end`   ARGV[4] the compacted stream's bytes
-- ARGV[5] when the segment of the oldest tombstone kept was sealed ('' when none is kept)
-- ARGV[6] how many aborted transactions the pass removed the markers of,
--         then their members of the index (`<producer id>:<first offset>`):
--         they leave the index with their markers, in this same step, so
--         a read_committed reader never looks for a marker that is gone
-- then pairs: a segment's member as the pass read it, its member after
--
-- Reply: 1 swapped; 0 the lease is another's, the pass is not the
-- current one, or another pass finished first (nothing changed); -1 the
-- partition is gone.
local worker, pass = string.match(ARGV[1], '^(%S+) (%S+)$')
-- Another worker's pass, or a newer one of this worker's, may be writing
-- KEYS[3]: it is left to its writer (whose start removes leftovers).
if not worker or redis.call('GET', KEYS[2]) ~= worker then
  return 0
end
local meta = redis.call('HMGET', KEYS[1], 'next_offset', 'log_start', 'clean_end', 'compacting_pass')
if not meta[1] then
  redis.call('UNLINK', KEYS[3])
  return -1
end
if meta[4] ~= pass then
  return 0
end
-- This pass's stream from here on.
local function abandon(reply)
  redis.call('UNLINK', KEYS[3])
  redis.call('HDEL', KEYS[1], 'compacting_pass')
  return reply
end
if (meta[3] or '') ~= ARGV[2] then
  return abandon(0)
end
-- Remote storage is being turned on (archive_guard.lua): no pass swaps in.
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'no_compaction_until') or '0')
if until_ms > 0 then
  local now = redis.call('TIME')
  if tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) < until_ms then
    return abandon(0)
  end
end
redis.call('HDEL', KEYS[1], 'compacting_pass')
-- DeleteRecords or retention may have moved the log start meanwhile.
redis.call('XTRIM', KEYS[3], 'MINID', meta[2])
redis.call('UNLINK', KEYS[4])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RENAME', KEYS[3], KEYS[4])
end
redis.call('HSET', KEYS[1], 'clean_end', ARGV[3], 'clean_bytes', ARGV[4])
if ARGV[5] == '' then
  redis.call('HDEL', KEYS[1], 'tomb_sealed')
else
  redis.call('HSET', KEYS[1], 'tomb_sealed', ARGV[5])
end
local forgotten = tonumber(ARGV[6])
if forgotten > 0 then
  redis.call('ZREM', KEYS[6], unpack(ARGV, 7, 6 + forgotten))
end
-- Segments retention removed meanwhile stay removed. Their sizes change:
-- seal.lua's total of them (kept only without compaction, or with remote
-- storage, which a pass under way when it was turned on may still meet)
-- is summed again.
for i = 7 + forgotten, #ARGV, 2 do
  if redis.call('ZREM', KEYS[5], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[5], cjson.decode(ARGV[i + 1]).base, ARGV[i + 1])
  end
end
if #ARGV >= 7 + forgotten then
  redis.call('HDEL', KEYS[1], 'sealed_shape')
end
return 1

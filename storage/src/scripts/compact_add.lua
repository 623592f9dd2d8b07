-- Appends a chunk of compacted batches to the stream a compaction pass is
-- writing, if this worker still holds the partition's lease and the pass
-- is still the partition's current one (so a worker whose lease lapsed
-- mid-pass cannot write into another's, nor go on with its own pass after
-- getting the lease back: another worker may have started over meanwhile,
-- and the stream would hold its start and this pass's end).
--
-- A call with no batches starts a pass: it removes what a pass before
-- left in KEYS[2] (one a crash cut short) and makes this pass the current
-- one, under the same lease check, so a worker whose lease lapsed cannot
-- remove the pass the holder is writing.
--
-- KEYS[1] ketch:{TAG}:lease
-- KEYS[2] ketch:{TAG}:compacting   the next compacted stream
-- KEYS[3] ketch:{TAG}:meta         field `compacting_pass`: the current pass
-- ARGV[1] the worker's id   ARGV[2] the pass's token (unique per pass)
-- then pairs: entry id (<last offset>-<offset span>), batch
--
-- Reply: 1 when added (started), 0 when the lease is another's or the pass
-- is not the current one (nothing done).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if #ARGV == 2 then
  -- Remote storage is being turned on (archive_guard.lua): no pass starts.
  local until_ms = tonumber(redis.call('HGET', KEYS[3], 'no_compaction_until') or '0')
  if until_ms > 0 then
    local now = redis.call('TIME')
    if tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) < until_ms then
      return 0
    end
  end
  redis.call('UNLINK', KEYS[2])
  redis.call('HSET', KEYS[3], 'compacting_pass', ARGV[2])
  return 1
end
if redis.call('HGET', KEYS[3], 'compacting_pass') ~= ARGV[2] then
  return 0
end
for i = 3, #ARGV, 2 do
  redis.call('XADD', KEYS[2], ARGV[i], 'b', ARGV[i + 1])
end
return 1

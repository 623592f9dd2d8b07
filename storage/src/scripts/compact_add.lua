-- Appends a chunk of compacted batches to the stream a compaction pass is
-- writing, if this worker still holds the partition's lease (so a worker
-- whose lease lapsed mid-pass cannot write into another's).
--
-- A call with no batches starts a pass: it removes what a pass before
-- left in KEYS[2] (one a crash cut short), under the same check, so a
-- worker whose lease lapsed cannot remove the pass the holder is writing.
--
-- KEYS[1] ketch:{TAG}:lease
-- KEYS[2] ketch:{TAG}:compacting   the next compacted stream
-- ARGV[1] the worker's id; then pairs: entry id (<last offset>-<offset span>), batch
--
-- Reply: 1 when added (started), 0 when the lease is another's (nothing
-- done).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if #ARGV == 1 then
  redis.call('UNLINK', KEYS[2])
  return 1
end
for i = 2, #ARGV, 2 do
  redis.call('XADD', KEYS[2], ARGV[i], 'b', ARGV[i + 1])
end
return 1

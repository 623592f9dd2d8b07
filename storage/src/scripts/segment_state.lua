-- Changes the state of one sealed segment: archived, quarantined (the
-- archive cannot write it; its batches are copied to the quarantine
-- stream), retry requested, or skipped (an operator gave up on it: a hole).
--
-- KEYS[1] ketch:{TAG}:segments  (see seal.lua); a segment's JSON gains
--         path + file_bytes once archived; quarantine = {reason, at, retry}
--         while quarantined; skipped = {reason, at, error} once skipped
-- ARGV[1] the segment's base offset   ARGV[2] its last offset
-- ARGV[3] the operation:
--   'archived' ARGV[4] data file path, ARGV[5] its size, ARGV[6] the
--              offsets it has no rows for (JSON [[first, last], ...]):
--              records the file (and ends a quarantine)
--   'quarantine' ARGV[4] why: quarantines it (keeps a pending retry's
--              reason up to date and clears the retry)
--   'retry'    asks the storage worker to archive it again
--   'skip'     ARGV[4] why: gives up on it; its batches may be deleted.
--              ARGV[5] 'held' when the caller holds the partition's
--              archiving registration (no worker can be archiving it then)
--   'holes'    ARGV[4] its data file's path, ARGV[5] the offsets that file
--              has no rows for (JSON): records them again, if the segment
--              is archived in that file ('gone' otherwise)
--   'purged'   its copy in the quarantine stream is deleted
--   'lost'     ARGV[4] why, ARGV[5] the data file's path: gives up on an
--              archived segment whose data file the object store lost
--              (the caller found it missing, and the segment below the
--              local start: its batches are gone from Redis); it becomes
--              skipped, a hole readers step over, forgets the file, and
--              is marked `lost` (it was archived: ListOffsets -5 counts it)
--
-- A segment archived after a quarantine, or skipped, has `purge = true`
-- until its copy in the quarantine stream is deleted ('purged'): a
-- gateway killed in between leaves the flag, and the partition's storage
-- worker deletes the copy on its next tick.
--
-- Reply (a status string): 'ok'; 'gone' when no such segment exists (deleted
-- by retention or DeleteRecords, or its topic deleted); 'archived' when the
-- operation needs a segment not yet archived and it is; 'not_quarantined'
-- for retry and skip of a segment that is not quarantined; 'retry_pending'
-- for skip of one whose retry is requested and not yet over; 'not_archived'
-- for lost of a segment with no data file (not archived, or archived
-- without one), or archived in another file than ARGV[5].
local found = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[1], 'BYSCORE')
local member, segment
for _, m in ipairs(found) do
  local s = cjson.decode(m)
  if s.last == tonumber(ARGV[2]) then
    member, segment = m, s
  end
end
if not segment then
  return 'gone'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[3]
if op == 'archived' then
  if segment.path then
    return 'ok'
  end
  segment.path = ARGV[4]
  segment.file_bytes = tonumber(ARGV[5])
  if segment.quarantine then
    segment.purge = true
  end
  segment.quarantine = nil
  if ARGV[6] and ARGV[6] ~= '[]' then
    segment.holes = cjson.decode(ARGV[6])
  end
elseif op == 'holes' then
  if segment.path ~= ARGV[4] then
    return 'gone'
  end
  if ARGV[5] == '[]' then
    segment.holes = nil
  else
    segment.holes = cjson.decode(ARGV[5])
  end
elseif op == 'purged' then
  if not segment.purge then
    return 'ok'
  end
  segment.purge = nil
elseif op == 'lost' then
  if segment.skipped then
    return 'ok'
  end
  if not segment.path or segment.path == '' or segment.path ~= ARGV[5] then
    return 'not_archived'
  end
  segment.skipped = {reason = ARGV[4], at = now, error = 'data file lost: ' .. segment.path}
  segment.path, segment.file_bytes, segment.holes = nil, nil, nil
  segment.lost = true
elseif segment.path then
  return 'archived'
elseif op == 'quarantine' then
  if segment.skipped then
    return 'ok'
  end
  segment.quarantine = {reason = ARGV[4], at = now, retry = false}
  segment.purge = nil
elseif op == 'retry' then
  if not segment.quarantine then
    return 'not_quarantined'
  end
  segment.quarantine.retry = true
elseif op == 'skip' then
  if segment.skipped then
    return 'ok'
  end
  if not segment.quarantine then
    return 'not_quarantined'
  end
  -- The storage worker may be archiving it now: skipping would delete the
  -- batches it reads, and its file may then record the segment archived.
  if segment.quarantine.retry and ARGV[5] ~= 'held' then
    return 'retry_pending'
  end
  segment.skipped = {reason = ARGV[4], at = now, error = segment.quarantine.reason}
  segment.quarantine = nil
  segment.purge = true
else
  return redis.error_reply('unknown segment operation ' .. op)
end
redis.call('ZREM', KEYS[1], member)
redis.call('ZADD', KEYS[1], segment.base, cjson.encode(segment))
return 'ok'

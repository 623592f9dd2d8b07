-- Seals a partition's open segment when it is full or old enough, and
-- applies retention to the sealed ones.
--
-- KEYS[1] ketch:{TAG}:meta      partition metadata (seg_base, seg_bytes, seg_start_ms, seg_max_ts, seg_first_ts,
--                               abt_to and abt_at: the aborted index's trim bound, below; sealed_bytes and
--                               sealed_shape: the sealed segments' total, for retention.bytes, below)
-- KEYS[2] ketch:{TAG}:segments  sorted set: score = base offset, member = JSON
--                               {base, last, bytes, max_ts, sealed_ms[, first_ts][, path, file_bytes]
--                               [, quarantine][, skipped]}; `path` is set once the segment is
--                               archived, `quarantine` while the archive cannot write it (its
--                               batches are then in KEYS[5] too), `skipped` once an operator
--                               gave up on it
-- KEYS[3] ketch:{TAG}:log       the stream
-- KEYS[4] ketch:{TAG}:producers idempotent producers' state (scripts/producer_state.lua, prepended here)
-- KEYS[5] ketch:{TAG}:quarantine batches of quarantined segments (see segment_state.lua)
-- KEYS[6] ketch:{TAG}:aborted   aborted transactions, by abort marker offset (see append.lua)
-- KEYS[7] ketch:{TAG}:clean     the compacted part of a compacted topic's log (see compact_swap.lua)
-- KEYS[8] ketch:{TAG}:times     the time index (see append.lua): its entries below the local
--                               start go, as Kafka deletes a segment's time index with it
--                               (lookups start at the local start anyway)
-- ARGV[1] segment.bytes     ARGV[2] segment.ms
-- ARGV[3] retention.ms (-1: none)   ARGV[4] retention.bytes (-1: none)
-- ARGV[5] 1 without remote storage, 0 with it (segments wait for the archive)
-- ARGV[6] producers.expiration in ms: producer state idle longer is dropped
-- ARGV[7] local.retention.ms (-1: none)   ARGV[8] local.retention.bytes (-1: none)
-- ARGV[9] 1 while remote storage is off and the topic's archive is being
--         deleted (turned off with remote.log.delete.on.disable: the topic's
--         `drop_archive`): what the archive held is let go (the log start
--         moves to the local start, segments forget their archive state); 0
--         otherwise, also for a topic without remote storage, whose kept
--         segments' records need not be read for it
-- ARGV[10] the partition's wake-up channel: told '<next offset> <log start>'
--          when the log start moved (gateways drop what they keep of the
--          partition's tail below it: tail.rs)
--
-- Reply: {segments sealed, segments deleted, log start offset, producers
-- expired, local start offset}, or {-1} when the partition does not exist.
local meta = redis.call('HMGET', KEYS[1], 'next_offset', 'log_start', 'seg_base', 'seg_bytes',
  'seg_start_ms', 'seg_max_ts', 'local_start', 'seg_first_ts', 'clean_end', 'sealed_bytes', 'sealed_shape')
if not meta[1] then
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local next_offset = tonumber(meta[1])
local log_start = tonumber(meta[2])
local local_start = math.max(tonumber(meta[7] or meta[2]), log_start)
local seg_base = tonumber(meta[3] or '0')
local seg_bytes = tonumber(meta[4] or '0')
local remote = ARGV[5] == '0'
local no_archive = ARGV[9] == '1'
local retention_ms = tonumber(ARGV[3])
local retention_bytes = tonumber(ARGV[4])

-- retention.bytes needs the sealed segments' total. A remote topic keeps a
-- record per archived segment (with retention.ms -1, for ever), so it is
-- not summed from every record on every call: this script keeps it (meta
-- `sealed_bytes`) as it seals and deletes segments, beside the shape the
-- segments had then (`sealed_shape`: their count, first and last base,
-- and for a partition compacted before, the compacted stream's end and
-- bytes, which every compaction pass rewrites).
-- Every other writer of the records leaves their sizes as they were: the
-- archive's state changes (segment_state.lua) and the lets-go of an
-- archive below rewrite records with the same bytes. A seal or deletion by
-- a gateway of an older release moves a last or first base, and the total
-- is summed again from every record. Compaction passes rewrite sizes, even
-- passes that move nothing but tombstones (an older release's among them):
-- a compacted partition (`clean_end`) keeps no total and sums its records
-- each call (it has no remote storage, so they are only those in Redis),
-- and drops a shape kept from before its first pass. One whose topic
-- turned to remote storage since (compaction no longer runs) keeps one
-- again, summed afresh.
local function segments_shape()
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2] or ''
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2] or ''
  local shape = string.format('%d', redis.call('ZCARD', KEYS[2])) .. ' ' .. first .. ' ' .. last
  -- A partition compacted before its topic turned to remote storage: every
  -- compaction pass, of any release, rewrites these two.
  local clean = redis.call('HMGET', KEYS[1], 'clean_end', 'clean_bytes')
  if clean[1] then
    shape = shape .. ' ' .. clean[1] .. ' ' .. (clean[2] or '')
  end
  return shape
end
local keeps_total = retention_bytes >= 0 and (remote or not meta[9])
if meta[9] and not remote and meta[11] then
  redis.call('HDEL', KEYS[1], 'sealed_shape')
  meta[11] = nil
end
local sealed_total = nil
if keeps_total and meta[10] and meta[11] and meta[11] == segments_shape() then
  sealed_total = tonumber(meta[10])
end

local sealed = 0
-- An open segment whose newest record is past retention.ms is sealed too,
-- so that retention deletes it below (Kafka rolls and deletes an active
-- segment past retention: an idle partition's last records do not wait for
-- segment.ms). Records without a timestamp (-1) never expire while open.
local open_max_ts = tonumber(meta[6] or '-1')
local open_expired = tonumber(ARGV[3]) >= 0 and open_max_ts >= 0 and open_max_ts < now - tonumber(ARGV[3])
if seg_bytes > 0 and (seg_bytes >= tonumber(ARGV[1]) or now - tonumber(meta[5] or now) >= tonumber(ARGV[2])
    or open_expired) then
  -- first_ts: the first batch's largest timestamp (absent when a gateway
  -- of an older release opened the segment).
  local segment = cjson.encode({base = seg_base, last = next_offset - 1, bytes = seg_bytes,
    max_ts = tonumber(meta[6] or '-1'), sealed_ms = now, first_ts = meta[8] and tonumber(meta[8])})
  redis.call('ZADD', KEYS[2], seg_base, segment)
  redis.call('HSET', KEYS[1], 'seg_base', string.format('%d', next_offset), 'seg_bytes', '0')
  redis.call('HDEL', KEYS[1], 'seg_start_ms', 'seg_max_ts', 'seg_first_ts')
  sealed = 1
  if sealed_total then
    sealed_total = sealed_total + seg_bytes
  end
  seg_bytes = 0
end

-- Remote storage turned off: the archive is being deleted, so the log starts
-- where Redis does (Kafka moves the log start offset to the local log start
-- offset). The segments below it, all trimmed from Redis, go below.
if no_archive and local_start > log_start then
  log_start = local_start
  redis.call('HSET', KEYS[1], 'log_start', string.format('%d', log_start))
end

-- retention.ms / retention.bytes: what Kafka clients can see. Whole sealed
-- segments go, oldest first (Kafka's rule: while the rest still holds
-- retention.bytes). With remote storage a segment must be archived (or
-- skipped by an operator) first, so the archive misses nothing; its Iceberg
-- rows stay. A quarantined segment waits for the operator. A segment
-- DeleteRecords moved the log start past goes without either.
local deleted = 0
-- The sealed segments from score `from` on ('-inf', or a base offset), in
-- order, decoded one at a time as the loop asks, and read in chunks that
-- grow from 8 to SEGMENT_CHUNK: a remote topic keeps a record per archived
-- segment (with retention.ms -1, for ever), and a call must not read them
-- all when it needs the first. Chunks go by score after the last one
-- given, so ZREMs of given members (and a member rewritten at its score)
-- do not shift what comes next.
local SEGMENT_CHUNK = 256
local function segments_from(from)
  local chunk, at, last, size = {}, 1, nil, 8
  return function()
    if at > #chunk then
      local min = from
      if last then
        min = '(' .. last
      end
      chunk = redis.call('ZRANGE', KEYS[2], min, '+inf', 'BYSCORE', 'LIMIT', 0, size, 'WITHSCORES')
      size = math.min(size * 2, SEGMENT_CHUNK)
      at = 1
      if #chunk == 0 then
        return nil
      end
    end
    local member, score = chunk[at], chunk[at + 1]
    at = at + 2
    last = score
    return cjson.decode(member), member
  end
end
-- retention.bytes needs the sealed segments' total (kept above, or summed
-- from every record when it cannot be trusted); without it, only the
-- oldest are read.
local total = seg_bytes
local summed = false
if retention_bytes >= 0 then
  if not sealed_total then
    sealed_total = 0
    for segment in segments_from('-inf') do
      sealed_total = sealed_total + segment.bytes
    end
    summed = true
  end
  total = total + sealed_total
end
-- The base of the first segment kept, nil when none is.
local first_kept = nil
local new_start = log_start
-- When a segment's age counts from: its largest timestamp, or for one whose
-- records carry none (-1) when it was sealed, as Kafka's counts from its
-- file's last write (not from the epoch: it went at once).
local function aged_from(segment)
  if segment.max_ts >= 0 then
    return segment.max_ts
  end
  return segment.sealed_ms or now
end
for segment, member in segments_from('-inf') do
  local expired = retention_ms >= 0 and aged_from(segment) < now - retention_ms
  local oversize = retention_bytes >= 0 and total - segment.bytes >= retention_bytes
  -- Segments below the log start (DeleteRecords) go as well.
  local below = segment.last < log_start
  -- Wholly below the log start (DeleteRecords), a segment need not be
  -- archived first: Kafka never copies deleted records to remote storage.
  local settled = segment.path or segment.skipped or below
  if not (expired or oversize or below) or (remote and not settled) then
    first_kept = segment.base
    break
  end
  redis.call('ZREM', KEYS[2], member)
  total = total - segment.bytes
  if sealed_total then
    sealed_total = sealed_total - segment.bytes
  end
  new_start = math.max(new_start, segment.last + 1)
  deleted = deleted + 1
end
if keeps_total and sealed_total and (summed or sealed > 0 or deleted > 0) then
  redis.call('HSET', KEYS[1], 'sealed_bytes', string.format('%d', sealed_total), 'sealed_shape', segments_shape())
end
if new_start > log_start then
  log_start = new_start
  redis.call('HSET', KEYS[1], 'log_start', string.format('%d', log_start))
end
-- Quarantined batches below the log start are no longer readable (aborted
-- transactions that ended below it go below, with the local trim).
redis.call('XTRIM', KEYS[5], 'MINID', string.format('%d', log_start))
redis.call('XTRIM', KEYS[7], 'MINID', string.format('%d', log_start))

-- Remote storage turned off: the segments still in Redis forget their archive
-- files and quarantine (their batches are in the log), and the quarantine
-- copies go. Turned on again, they are archived anew.
if no_archive and first_kept then
  local cleared = false
  for segment, member in segments_from(string.format('%d', first_kept)) do
    if segment.path or segment.quarantine or segment.skipped or segment.holes or segment.purge then
      segment.path, segment.file_bytes, segment.quarantine = nil, nil, nil
      segment.skipped, segment.holes, segment.purge = nil, nil, nil
      redis.call('ZREM', KEYS[2], member)
      redis.call('ZADD', KEYS[2], segment.base, cjson.encode(segment))
      cleared = true
    end
  end
  if cleared then
    redis.call('UNLINK', KEYS[5])
  end
end

-- local.retention.ms / local.retention.bytes (remote storage only): archived
-- segments leave Redis; fetches below the local start read the archive. A
-- quarantined segment's batches are in the quarantine stream, and a skipped
-- one's are given up, so the log is trimmed past them too.
local new_local = math.max(local_start, log_start)
if remote and first_kept then
  -- The segments still in Redis: from the one holding the local start on
  -- (those below it are in the archive, and need not be read).
  local holding = redis.call('ZRANGE', KEYS[2], string.format('%d', new_local), '-inf', 'BYSCORE', 'REV',
    'LIMIT', 0, 1, 'WITHSCORES')
  local from = first_kept
  if holding[2] then
    from = math.max(from, tonumber(holding[2]))
  end
  local in_redis = {}
  local local_total = seg_bytes
  for segment in segments_from(string.format('%d', from)) do
    if segment.last >= new_local then
      in_redis[#in_redis + 1] = segment
      local_total = local_total + segment.bytes
    end
  end
  local local_ms = tonumber(ARGV[7])
  local local_bytes = tonumber(ARGV[8])
  for _, segment in ipairs(in_redis) do
    local expired = local_ms >= 0 and aged_from(segment) < now - local_ms
    local oversize = local_bytes >= 0 and local_total - segment.bytes >= local_bytes
    local away = segment.path or segment.quarantine or segment.skipped
    if not away or not (expired or oversize) then
      break
    end
    local_total = local_total - segment.bytes
    new_local = segment.last + 1
  end
end
if new_local > local_start then
  local_start = new_local
  redis.call('HSET', KEYS[1], 'local_start', string.format('%d', local_start))
  -- Entry ids are <last_offset>-<count>: MINID removes batches whose last offset is below it.
  redis.call('XTRIM', KEYS[3], 'MINID', string.format('%d', local_start))
end

-- Aborted transactions that ended below the log start are not needed. With
-- remote storage neither are those that ended below the local start, as far
-- as the first segment there that is not settled in the archive (one
-- quarantined, served raw from the quarantine stream, or whose archive copy
-- is being purged): a read below the local start reads the archive, which
-- holds committed records only (architecture.md, Decision (x)), and
-- archiving reads the index from each segment's base. Else a topic whose
-- log start never moves (retention.ms -1, a long retention beside a short
-- local one) would keep one entry per aborted transaction for ever.
--
-- That bound lags ten minutes: a fetch reads a partition's batches first and
-- its aborted transactions after (as late as its long poll's end), and the
-- log start (retention, DeleteRecords) or the local start may pass the
-- batches it read meanwhile; trimming below either at once could take the
-- aborts those batches need, and a read_committed consumer would get
-- aborted records. Each call trims below the bound proposed at least ten
-- minutes before (meta `abt_to`, `abt_at`), never past the bound now, and
-- proposes the current one.
local proposed = redis.call('HMGET', KEYS[1], 'abt_to', 'abt_at')
local proposed_to, proposed_at = tonumber(proposed[1]), tonumber(proposed[2])
local ABORTED_TRIM_LAG_MS = 600000
local trim_due = proposed_to and proposed_at and now - proposed_at >= ABORTED_TRIM_LAG_MS
local propose_due = not proposed_at or now - proposed_at >= ABORTED_TRIM_LAG_MS
-- The bound is worked out only when used (every ten minutes). With remote
-- storage, every segment below the local start is archived, quarantined or
-- skipped (local retention trims past no other), and a quarantined one, or
-- one whose quarantined copy is still to be deleted, has batches in the
-- quarantine stream: with that stream empty the bound is the local start.
-- Else the records below the local start are read from the segment holding
-- the stream's oldest batch on (its entry ids, `<last offset>-<count>`, go
-- in offset order: no segment below it has a copy there), many for a topic
-- that keeps its archive long when that is far below; a record is decoded
-- only when its text does not show it settled: cjson writes a field it has
-- as `"name":` (a quote inside a string value is escaped), and one it lacks
-- not at all.
if trim_due or propose_due then
  local bound = log_start
  if remote and not no_archive then
    bound = math.max(log_start, local_start)
    local from, unsettled = '-inf', nil
    local oldest = redis.call('XRANGE', KEYS[5], '-', '+', 'COUNT', 1)[1]
    local scan = oldest ~= nil
    local oldest_last = oldest and tonumber(string.match(oldest[1], '^(%d+)-'))
    if oldest_last then
      local holding = redis.call('ZRANGE', KEYS[2], string.format('%d', oldest_last), '-inf', 'BYSCORE', 'REV',
        'LIMIT', 0, 1, 'WITHSCORES')
      from = holding[2] or '-inf'
    end
    while scan and not unsettled do
      local chunk = redis.call('ZRANGE', KEYS[2], from, '(' .. string.format('%d', bound), 'BYSCORE',
        'LIMIT', 0, 1024, 'WITHSCORES')
      if #chunk == 0 then
        break
      end
      for j = 1, #chunk, 2 do
        local member = chunk[j]
        local plain = not (string.find(member, '"quarantine":', 1, true) or string.find(member, '"purge":', 1, true))
          and (string.find(member, '"path":', 1, true) or string.find(member, '"skipped":', 1, true))
        if not plain then
          local segment = cjson.decode(member)
          if segment.quarantine or segment.purge or not (segment.path or segment.skipped) then
            unsettled = tonumber(chunk[j + 1])
            break
          end
        end
      end
      from = '(' .. chunk[#chunk]
    end
    if unsettled then
      bound = math.max(log_start, unsettled)
    end
  end
  if trim_due then
    redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. string.format('%d', math.min(proposed_to, bound)))
  end
  if propose_due then
    redis.call('HSET', KEYS[1], 'abt_to', string.format('%d', bound), 'abt_at', string.format('%d', now))
  end
end

-- Producer state idle past producers.expiration is forgotten, as Kafka
-- forgets it: the producer's next batch then starts over at sequence 0.
local expired = 0
local producers = redis.call('HGETALL', KEYS[4])
for i = 1, #producers, 2 do
  local ok, state = pcall(decode_state, producers[i + 1])
  -- A producer with an open transaction here is kept: its data holds the
  -- last stable offset until the marker, which needs the state.
  local open = ok and type(state) == 'table' and type(state.x) == 'table' and state.x.f
  if ok and type(state) == 'table' and not open and (state.t or 0) < now - tonumber(ARGV[6]) then
    redis.call('HDEL', KEYS[4], producers[i])
    expired = expired + 1
  end
end
-- The time index's entries are in offset order (their scores, the
-- running max timestamp, only grow): those below the local start are its
-- first ranks. At most TIMES_TRIM a call, so a long index (one kept from
-- before this trim existed) shrinks over several ticks without a long
-- script. Those below a compacted topic's `clean_end` go too: its log
-- start never moves (no retention), and the index would otherwise keep an
-- entry per few KiB ever appended while compaction keeps the data small;
-- a lookup there scans the compacted stream from its start instead.
local below = math.max(local_start, log_start, tonumber(meta[9] or '0'))
local TIMES_TRIM = 10000
local lo, hi = 0, math.min(redis.call('ZCARD', KEYS[8]), TIMES_TRIM)
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  local member = redis.call('ZRANGE', KEYS[8], mid, mid)[1]
  if tonumber(member) < below then
    lo = mid + 1
  else
    hi = mid
  end
end
if lo > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[8], 0, lo - 1)
end

if log_start > tonumber(meta[2]) and ARGV[10] then
  redis.call('SPUBLISH', ARGV[10], string.format('%d %d', next_offset, log_start))
end
return {sealed, deleted, log_start, expired, local_start}

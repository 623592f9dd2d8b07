-- Appends one record batch to a partition. A small batch is passed in and
-- stored by one call (mode 'inline'); a large one is stored in two steps
-- around an XADD:
--
--   MULTI
--   EVALSHA append 4 meta times log staging  reserve <expected> <count> <max_ts> <wake> <interval> <size> ...
--   XADD staging NOMKSTREAM <last>-<count> b <batch> t <max_ts>
--   EVALSHA append 4 meta times log staging  finish
--   EXEC
--
-- The batch bytes never pass through Lua: Redis hashes every byte of every
-- string that enters its Lua interpreter, which cost more than half of
-- Redis's CPU time on the produce path. Instead, `reserve` checks that the
-- caller's expected next offset is the partition's real one, assigns the
-- offsets and renames the log to the staging key; the XADD writes there
-- (NOMKSTREAM: it does nothing when the staging key is absent); `finish`
-- renames it back. An inline call takes the partition's next offset as it
-- finds it, so appends of small batches through several gateways never
-- retry. When `reserve` refuses (unknown partition, stale offset,
-- or this script not loaded), the staging key does not exist and the XADD
-- stores nothing. EXEC makes the three steps atomic: no other client ever
-- sees the staging key.
--
-- KEYS[1] ketch:{TAG}:meta     partition metadata hash (absent: no such partition)
-- KEYS[2] ketch:{TAG}:times    sparse time index: score = running max timestamp, member = base offset
-- KEYS[3] ketch:{TAG}:log      stream, one entry per batch, id <last_offset>-<record_count>
-- KEYS[4] ketch:{TAG}:staging  the log's name during the XADD
-- KEYS[5] ketch:{TAG}:producers  hash: producer id -> state, decoded and encoded by
--                                scripts/producer_state.lua (prepended to this script) into
--                                {e: epoch, b: the last five batches, flat: first_seq, last_seq,
--                                base_offset, first_seq, ..., t: last append, ms, x: the producer's
--                                transaction here, if any: {n: transaction number, e: epoch, f: first
--                                offset of its data (absent: none yet)}, l: the number of the last
--                                transaction a marker ended here}
-- KEYS[6] ketch:{TAG}:txns       open transactions with data here: score = first offset, member = producer id
-- KEYS[7] ketch:{TAG}:aborted    aborted transactions: score = marker offset, member = '<producer id>:<first offset>'
-- ARGV[1] 'reserve', 'inline', 'marker' or 'finish'
-- reserve, inline, marker: ARGV[2] expected next offset (-1: unknown), ARGV[3] record
--          count, ARGV[4] max timestamp (ms), ARGV[5] wake-up channel,
--          ARGV[6] time index interval in bytes, ARGV[7] batch size in bytes
--          ARGV[8] producer id (-1: not idempotent), ARGV[9] producer epoch,
--          ARGV[10] base sequence (marker: the transaction number)
-- reserve, inline: ARGV[11] '1' for a transactional batch, else '0'
-- marker:  ARGV[11] 'commit' or 'abort'
-- ARGV[12] '1' when the layout allows the compact producer state encoding, else '0'
-- inline, marker: ARGV[13] the batch bytes (small batches only: they get hashed)
-- reserve: ARGV[13] '' (unused)
-- ARGV[14] (optional) the appending gateway's presence channel for ARGV[5]
--          (storage/src/wake.rs, WakeHub::presence): its subscriber holds it
--          exactly while it holds ARGV[5]. The append is announced on
--          ARGV[5] only when more clients hold ARGV[5] than hold it: when
--          someone other than the appending gateway listens (that one wakes
--          its own fetches). Without it, always announced.
--
-- A transactional batch is stored only while the producer's transaction
-- is registered here (scripts/txn_join.lua, at AddPartitionsToTxn) at the
-- batch's epoch, and a non-transactional batch of the producer only while
-- it has no transaction with data here (Kafka: "expected transactional
-- write"); the first one opens the transaction here: the partition's
-- last stable offset (meta `txn_first`, the smallest first offset of an
-- open transaction) stops there until the marker. A marker ends the
-- registered transaction of that number: it is written (as a control
-- batch) only when the transaction stored data here, an abort is added to
-- the aborted index, and the producer's epoch becomes the marker's (an
-- abort that fences a producer carries a bumped epoch). A marker for
-- another transaction, or one older than the producer's epoch, changes
-- nothing: markers may be written twice (a crashed gateway's commit is
-- completed by another), never for the wrong transaction.
--
-- Reply of reserve and inline, tagged by its first element:
--   {'stored', base_offset, log_start_offset}  the batch is (inline) or will
--       be (reserve) stored;
--   {'duplicate', base_offset, log_start_offset}  it repeats one of the
--       producer's last five batches: nothing is stored, base_offset is the
--       original's (the producer's last-activity time is still written, so
--       a WAIT on this connection covers the original batch too);
--   {'no_partition'}  the partition does not exist;
--   {'moved', next_offset}  (reserve only) the expected offset was wrong:
--       retry with it;
--   {'out_of_order'}, {'stale_epoch'}  the producer's sequence or epoch
--       is refused (a producer the partition does not know, or no longer
--       does, may start at any sequence, as in Kafka);
--   {'not_in_transaction'}  a transactional batch of a producer whose
--       transaction does not include this partition (at this epoch), or a
--       non-transactional one of a producer whose transaction has data here;
--   {'skipped'}  (marker only) nothing to end here: no data of that
--       transaction, or an older marker.
-- Reply of finish: 1 when the log was renamed back, else 0.
if ARGV[1] == 'finish' then
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('RENAME', KEYS[4], KEYS[3])
    return 1
  end
  return 0
end

local meta = redis.call('HMGET', KEYS[1], 'next_offset', 'log_start', 'max_ts', 'idx_bytes', 'bytes',
  'seg_bytes', 'seg_start_ms', 'seg_max_ts', 'sized_to')
if not meta[1] then
  return {'no_partition'}
end
local base = tonumber(meta[1])
-- An inline batch is stored at the partition's next offset as it finds it
-- (the XADD below computes its id); a staged one needs the offset its XADD
-- was queued with.
if ARGV[1] == 'reserve' and base ~= tonumber(ARGV[2]) then
  return {'moved', base}
end
-- Nothing was ever appended: an empty log stream here is one an older
-- release's first staged batch left on Redis 7.2 or later (an entry 0-1
-- added and deleted, its XSETID back to 0-0 refused), whose last id 0-1
-- would refuse a one-record batch at offset 0 for good. It goes; the
-- append makes it again.
if base == 0 and redis.call('XLEN', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[3])
end
local count = tonumber(ARGV[3])
local ts = tonumber(ARGV[4])
local size = tonumber(ARGV[7])

-- Idempotent producers (Kafka's ProducerStateManager): the last five
-- batches of each producer, to answer a retried batch with its original
-- offset and to refuse gaps and stale epochs.
local producer_id = ARGV[8]
local now_ms
local function clock()
  if not now_ms then
    local now = redis.call('TIME')
    now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  end
  return now_ms
end
-- The open transaction's first offset here, after `txns` changed.
local function update_txn_first()
  local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('HSET', KEYS[1], 'txn_first', first[2])
  else
    redis.call('HDEL', KEYS[1], 'txn_first')
  end
end
local transactional = ARGV[1] ~= 'marker' and ARGV[11] == '1'
local opens_txn = nil
if ARGV[1] == 'marker' then
  local epoch = tonumber(ARGV[9])
  local number = tonumber(ARGV[10])
  local stored = redis.call('HGET', KEYS[5], producer_id)
  local state = stored and decode_state(stored) or {e = epoch, b = {}}
  if epoch < state.e then
    return {'skipped'}
  end
  local x = state.x
  local ends = x and x.n == number
  if x and x.n > number then
    return {'skipped'}
  end
  if epoch > state.e then
    -- A marker of a new epoch (an abort that fenced the producer) starts
    -- the epoch: the last one's batches are no duplicates of its own.
    state.e = epoch
    state.b = {}
  end
  state.t = clock()
  if ends then
    state.x = nil
  end
  -- A registration for this transaction arriving late (a stalled
  -- AddPartitionsToTxn) must not open it again (scripts/txn_join.lua).
  state.l = math.max(state.l or -1, number)
  redis.call('HSET', KEYS[5], producer_id, encode_state(state, ARGV[12]))
  if not (ends and x.f) then
    return {'skipped'}
  end
  redis.call('ZREM', KEYS[6], producer_id)
  update_txn_first()
  if ARGV[11] == 'abort' then
    redis.call('ZADD', KEYS[7], string.format('%d', base), producer_id .. ':' .. string.format('%d', x.f))
    -- aborted_span: the longest aborted transaction (marker - first
    -- offset), which bounds the index range a fetch must look at.
    local span = math.max(tonumber(redis.call('HGET', KEYS[1], 'aborted_span') or '0'), base - x.f)
    redis.call('HSET', KEYS[1], 'aborted_last', string.format('%d', base), 'aborted_span', string.format('%d', span))
  end
elseif tonumber(producer_id) >= 0 then
  local epoch = tonumber(ARGV[9])
  local first_seq = tonumber(ARGV[10])
  local last_seq = (first_seq + count - 1) % 2147483648
  local stored = redis.call('HGET', KEYS[5], producer_id)
  local state = stored and decode_state(stored) or nil
  -- Last activity (Redis time), for producers.expiration (scripts/seal.lua).
  local now_ms = clock()
  if state and epoch < state.e then
    return {'stale_epoch'}
  end
  if transactional and not (state and state.x and state.x.e == epoch) then
    return {'not_in_transaction'}
  end
  if not transactional and state and state.x and state.x.f then
    return {'not_in_transaction'}
  end
  if state and epoch == state.e then
    local b = state.b
    for i = 1, #b, 3 do
      if b[i] == first_seq and b[i + 1] == last_seq then
        state.t = now_ms
        redis.call('HSET', KEYS[5], producer_id, encode_state(state, ARGV[12]))
        return {'duplicate', b[i + 2], tonumber(meta[2])}
      end
    end
    -- No batch of this epoch yet (its marker started it): sequence 0.
    local last_stored = #b > 0 and b[#b - 1] or -1
    if first_seq ~= (last_stored + 1) % 2147483648 then
      return {'out_of_order'}
    end
  elseif state and state.e >= 0 and first_seq ~= 0 then
    -- A new epoch starts at sequence 0. A producer the partition does not
    -- know (new, forgotten after producers.expiration, or only registered
    -- by its transaction: epoch -1, txn_join.lua) may start anywhere:
    -- Kafka accepts any sequence without state (KIP-360), and a client
    -- told UNKNOWN_PRODUCER_ID would only resend the same batch.
    return {'out_of_order'}
  end
  if not state or epoch > state.e then
    -- A new epoch starts its sequences; what the partition knows of the
    -- producer's transactions stays.
    state = {e = epoch, b = {}, x = state and state.x, l = state and state.l}
  end
  local b = state.b
  if #b >= 15 then
    -- Keep the last five: drop the oldest (b is flat, three numbers a batch).
    b = {unpack(b, #b - 11)}
    state.b = b
  end
  local n = #b
  b[n + 1], b[n + 2], b[n + 3] = first_seq, last_seq, base
  state.t = now_ms
  if transactional and not state.x.f then
    state.x.f = base
    opens_txn = true
  end
  redis.call('HSET', KEYS[5], producer_id, encode_state(state, ARGV[12]))
end
if opens_txn then
  redis.call('ZADD', KEYS[6], string.format('%d', base), producer_id)
  if not redis.call('HGET', KEYS[1], 'txn_first') then
    redis.call('HSET', KEYS[1], 'txn_first', string.format('%d', base))
  end
end

if ARGV[1] ~= 'reserve' then
  redis.call('XADD', KEYS[3], string.format('%d-%d', base + count - 1, count), 'b', ARGV[13], 't', ARGV[4])
else
  if redis.call('EXISTS', KEYS[3]) == 0 then
    -- First batch: create the empty stream the staged XADD needs, its last
    -- id 0-0 (a one-record batch at offset 0 is entry 0-1). Through a
    -- consumer group made and dropped at once: an entry added and deleted
    -- would leave 0-1 as the largest id deleted, below which Redis 7.2 and
    -- later refuse XSETID.
    redis.call('XGROUP', 'CREATE', KEYS[3], 'ketch-create', '0', 'MKSTREAM')
    redis.call('XGROUP', 'DESTROY', KEYS[3], 'ketch-create')
  end
  redis.call('RENAME', KEYS[3], KEYS[4])
end

local idx_bytes = tonumber(meta[4] or '0') + size
local max_ts = tonumber(meta[3] or '-1')
if ts > max_ts then
  redis.call('HSET', KEYS[1], 'max_ts', ARGV[4], 'max_ts_offset', string.format('%d', base))
  if max_ts < 0 or idx_bytes >= tonumber(ARGV[6]) then
    redis.call('ZADD', KEYS[2], ARGV[4], string.format('%d', base))
    idx_bytes = 0
  end
end
-- The open segment (see scripts/seal.lua): its exact bytes, when its first
-- batch arrived (Redis time), that batch's largest timestamp
-- (max.compaction.lag.ms counts from it, as Kafka's cleaner) and the
-- segment's largest timestamp.
local seg_start = meta[7]
if not seg_start then
  seg_start = string.format('%d', clock())
  redis.call('HSET', KEYS[1], 'seg_first_ts', ARGV[4])
end
local seg_max_ts = math.max(tonumber(meta[8] or '-1'), ts)
-- Size classes, which bound how many entries a gateway's read may ask for
-- (Store::read): `sz<k>` is the last offset of the newest batch of class
-- k, sizes in [2^k, 2^(k+1)) (class 6 takes every smaller batch). They
-- describe every batch from `sized_from` to `sized_to` (exclusive); a
-- batch appended by a gateway that keeps no classes (before layout 2)
-- leaves `sized_to` behind, and the next batch starts the range again.
local _, exponent = math.frexp(size)
local class = math.min(math.max(exponent - 1, 6), 30)
if tonumber(meta[9] or '-1') ~= base then
  redis.call('HSET', KEYS[1], 'sized_from', string.format('%d', base))
end
redis.call('HSET', KEYS[1], 'next_offset', string.format('%d', base + count),
  'sized_to', string.format('%d', base + count),
  'sz' .. class, string.format('%d', base + count - 1),
  'idx_bytes', string.format('%d', idx_bytes),
  'bytes', string.format('%d', tonumber(meta[5] or '0') + size),
  'seg_bytes', string.format('%d', tonumber(meta[6] or '0') + size),
  'seg_start_ms', seg_start,
  'seg_max_ts', string.format('%d', seg_max_ts))
local listeners = ARGV[14] and ARGV[14] ~= '' and redis.call('PUBSUB', 'SHARDNUMSUB', ARGV[5], ARGV[14])
if not listeners or listeners[2] > listeners[4] then
  redis.call('SPUBLISH', ARGV[5], string.format('%d', base + count))
end
return {'stored', base, tonumber(meta[2])}

-- Registers a producer's transaction with a partition (AddPartitionsToTxn):
-- from then on the partition takes the producer's transactional batches
-- of that epoch (scripts/append.lua), until a marker of the transaction's
-- number ends it there.
--
-- KEYS[1] ketch:{TAG}:meta       partition metadata (absent: no such partition)
-- KEYS[2] ketch:{TAG}:producers  producer id -> state (scripts/producer_state.lua, prepended here)
-- ARGV[1] producer id, ARGV[2] epoch, ARGV[3] transaction number
-- ARGV[4] '1' when the layout allows the compact state encoding, else '0'
--
-- Reply: 'ok'; 'no_partition'; 'stale_epoch' (the partition knows a newer
-- epoch of the producer: it was fenced); 'pending' (an earlier
-- transaction of the producer still has data here and no marker yet);
-- 'ended' (this transaction, or a later one, was registered or ended here
-- already: a late registration, which must not open it again).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'no_partition'
end
local epoch = tonumber(ARGV[2])
local number = tonumber(ARGV[3])
local stored = redis.call('HGET', KEYS[2], ARGV[1])
local state = stored and decode_state(stored) or nil
if state and epoch < state.e then
  return 'stale_epoch'
end
if state and number <= (state.l or -1) then
  return 'ended'
end
if state and state.x then
  if state.x.n == number and state.x.e == epoch then
    return 'ok'
  end
  if state.x.n > number then
    return 'ended'
  end
  if state.x.f then
    return 'pending'
  end
end
if not state then
  -- Known here only by this registration: no epoch yet (Kafka's
  -- NO_PRODUCER_EPOCH), so its first batch may start at any sequence, as a
  -- producer the partition does not know may (append.lua). The
  -- transaction's epoch is x.e. A known producer keeps its epoch and
  -- batches until its first batch of the new epoch, which must start at
  -- sequence 0 (append.lua).
  state = {e = -1, b = {}}
end
local now = redis.call('TIME')
state.t = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
state.x = {n = number, e = epoch}
redis.call('HSET', KEYS[2], ARGV[1], encode_state(state, ARGV[4]))
return 'ok'

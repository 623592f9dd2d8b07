-- The transaction coordinator's state of one transactional id (Kafka's
-- TransactionMetadata), kept in Redis so that any gateway can serve the id
-- and take over a transaction a crashed gateway left half done.
--
-- KEYS[1] ketch:txn:{ID}  hash: pid, epoch, last_epoch (the epoch before the
--         last bump the producer asked for, -1: none), prev_pid (the
--         producer id before the last rotation, -1: none), state (Empty,
--         Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
--         CompleteAbort), timeout_ms,
--         started_ms (the open transaction's start), updated_ms, n (the
--         transaction number, +1 per transaction), partitions (JSON
--         [[topic, partition], ...]) and groups (JSON [group, ...]) of the
--         open or deciding transaction
-- ARGV[1] the operation; ARGV[2] the id's expiration (ms, refreshed by
--         every write that leaves nothing open:
--         transactional.id.expiration.ms); the rest below.
--
-- The commit point of a transaction is its state becoming PrepareCommit
-- (or PrepareAbort): markers are written to each partition and
-- transactional offsets applied to each group afterwards, by the gateway
-- that decided or, should it die, by whichever gateway finds the decision
-- (`expire`); then `complete` moves it to CompleteCommit/CompleteAbort,
-- and the producer may start its next transaction.
--
-- Replies carrying a transaction to finish:
--   {'finish', pid, epoch, n, 'commit'|'abort', partitions, groups}
local key = KEYS[1]
local op = ARGV[1]
local expiration = ARGV[2]
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local fields = redis.call('HGETALL', key)
local h = {}
for i = 1, #fields, 2 do
  h[fields[i]] = fields[i + 1]
end
local function num(name, default)
  local v = h[name]
  if v == nil then return default end
  return tonumber(v)
end
local function save(changes)
  local args = {}
  for k, v in pairs(changes) do
    h[k] = v
    table.insert(args, k)
    table.insert(args, type(v) == 'number' and string.format('%d', v) or v)
  end
  args[#args + 1] = 'updated_ms'
  args[#args + 1] = string.format('%d', now_ms)
  redis.call('HSET', key, unpack(args))
  -- transactional.id.expiration.ms counts only while nothing is open: an
  -- open or decided transaction's state must outlive any pause, or its
  -- markers could never be written.
  if h.state == 'Ongoing' or h.state == 'PrepareCommit' or h.state == 'PrepareAbort' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, expiration)
  end
end
local function finish_reply()
  local kind = (h.state == 'PrepareCommit') and 'commit' or 'abort'
  return {'finish', num('pid'), num('epoch'), num('n'), kind, h.partitions or '[]', h.groups or '[]'}
end
local preparing = h.state == 'PrepareCommit' or h.state == 'PrepareAbort'
-- Epoch bumps stop short of the largest epoch (Kafka: Short.MaxValue - 1).
local MAX_EPOCH = 32766

if op == 'init' then
  -- ARGV[3] transaction timeout (ms), ARGV[4] a fresh producer id (-1:
  -- none yet), ARGV[5] and ARGV[6] the producer id and epoch the request
  -- names (KIP-360; -1: none).
  -- Replies: {'ok', pid, epoch}; {'need_pid'}: call again with a fresh
  -- id; {'concurrent'}: a decided transaction is being finished; a
  -- 'finish' reply: the open transaction was moved to PrepareAbort with a
  -- bumped epoch (fencing its producer): finish it, then call again;
  -- {'fenced'}: the request names another producer id, or an epoch that
  -- is neither the current one nor (a retry) the one before it.
  --
  -- As in Kafka's TransactionMetadata, `last_epoch` is the epoch before
  -- a bump the producer asked for by naming its current epoch, so that a
  -- retry of that call gets the same answer; a bump by a new instance (no
  -- id named) or by fencing sets it to -1, so that the fenced producer
  -- cannot take the id back by naming its old epoch. `prev_pid` is the
  -- producer id before the last rotation (an exhausted epoch).
  local fresh = tonumber(ARGV[4])
  local timeout = ARGV[3]
  if not h.state then
    if fresh < 0 then return {'need_pid'} end
    save({pid = fresh, epoch = 0, last_epoch = -1, prev_pid = -1, state = 'Empty', n = 0, timeout_ms = timeout})
    return {'ok', fresh, 0}
  end
  local wanted_pid, wanted_epoch = tonumber(ARGV[5]), tonumber(ARGV[6])
  local named = wanted_pid >= 0
  if named and wanted_pid ~= num('pid')
      and not (wanted_pid == num('prev_pid', -1) and wanted_epoch >= MAX_EPOCH) then
    return {'fenced'}
  end
  if preparing then return {'concurrent'} end
  if h.state == 'Ongoing' then
    save({state = 'PrepareAbort', last_epoch = -1, epoch = math.min(num('epoch') + 1, MAX_EPOCH + 1)})
    return finish_reply()
  end
  if num('epoch') >= MAX_EPOCH and (not named or wanted_epoch == num('epoch')) then
    if fresh < 0 then return {'need_pid'} end
    save({prev_pid = num('pid'), pid = fresh, epoch = 0, last_epoch = named and num('epoch') or -1,
      state = 'Empty', timeout_ms = timeout})
    return {'ok', fresh, 0}
  end
  if not named then
    save({last_epoch = -1, epoch = num('epoch') + 1, state = 'Empty', timeout_ms = timeout})
  elseif wanted_epoch == num('epoch') then
    save({last_epoch = num('epoch'), epoch = num('epoch') + 1, state = 'Empty', timeout_ms = timeout})
  elseif wanted_epoch == num('last_epoch', -1) then
    -- A retry of a bump that succeeded: the same answer, no second bump.
    save({state = 'Empty', timeout_ms = timeout})
  else
    return {'fenced'}
  end
  return {'ok', num('pid'), num('epoch')}
end

-- The producer's own requests name its id and epoch.
local function check_producer(pid, epoch)
  if not h.state or tonumber(pid) ~= num('pid') then return 'mapping' end
  if tonumber(epoch) ~= num('epoch') then return 'fenced' end
  return nil
end

if op == 'add' then
  -- ARGV[3] pid, ARGV[4] epoch, ARGV[5] 'partitions' or 'groups', ARGV[6]
  -- JSON array of what to add ([topic, partition] pairs, or group ids).
  -- Replies: {'added', n, deadline_ms, opened} (opened: 1 when this call
  -- began the transaction, else 0); {'mapping'}; {'fenced'}; {'concurrent'}.
  local refused = check_producer(ARGV[3], ARGV[4])
  if refused then return {refused} end
  if preparing then return {'concurrent'} end
  local changes = {}
  if h.state ~= 'Ongoing' then
    changes = {state = 'Ongoing', n = num('n', 0) + 1, started_ms = now_ms, partitions = '[]', groups = '[]'}
    h.partitions, h.groups = '[]', '[]'
  end
  local list = cjson.decode(h[ARGV[5]] or '[]')
  local seen = {}
  for _, item in ipairs(list) do
    seen[cjson.encode(item)] = true
  end
  local grew = false
  for _, item in ipairs(cjson.decode(ARGV[6])) do
    local k = cjson.encode(item)
    if not seen[k] then
      seen[k] = true
      table.insert(list, item)
      grew = true
    end
  end
  if grew or changes.state then
    -- cjson encodes an empty table as {}: keep arrays arrays.
    changes[ARGV[5]] = #list == 0 and '[]' or cjson.encode(list)
    save(changes)
  else
    -- A retry: a write, so that a WAIT on this connection also covers the
    -- earlier call's (as for EndTxn below).
    redis.call('HSET', key, 'retried_ms', string.format('%d', now_ms))
  end
  return {'added', num('n'), num('started_ms') + num('timeout_ms'), changes.state and 1 or 0}
end

if op == 'end' then
  -- ARGV[3] pid, ARGV[4] epoch, ARGV[5] 'commit' or 'abort'.
  -- Replies: a 'finish' reply (the decision is made, or was made by an
  -- earlier try of this request); {'done'}: it was finished already;
  -- {'invalid_state'}: no transaction is open, or the other decision was
  -- made; {'mapping'}; {'fenced'}.
  local refused = check_producer(ARGV[3], ARGV[4])
  if refused then return {refused} end
  local prepare = ARGV[5] == 'commit' and 'PrepareCommit' or 'PrepareAbort'
  local complete = ARGV[5] == 'commit' and 'CompleteCommit' or 'CompleteAbort'
  if h.state == 'Ongoing' then
    save({state = prepare})
    return finish_reply()
  end
  -- A retry: the answer relies on the decision (or its completion) an
  -- earlier call wrote; a write here lets a WAIT on this connection cover
  -- that one too (replication keeps the order of writes).
  if h.state == prepare then
    redis.call('HSET', key, 'retried_ms', string.format('%d', now_ms))
    return finish_reply()
  end
  if h.state == complete then
    redis.call('HSET', key, 'retried_ms', string.format('%d', now_ms))
    return {'done'}
  end
  return {'invalid_state'}
end

if op == 'complete' then
  -- ARGV[3] the transaction number. Reply: 1 when it was completed now.
  if preparing and num('n') == tonumber(ARGV[3]) then
    local done = h.state == 'PrepareCommit' and 'CompleteCommit' or 'CompleteAbort'
    save({state = done, partitions = '[]', groups = '[]'})
    return 1
  end
  return 0
end

if op == 'expire' then
  -- The sweeper's look at one id. ARGV[3] how long (ms) a decided
  -- transaction may stay unfinished before another gateway finishes it.
  -- Replies: a 'finish' reply (an open transaction past its timeout, now
  -- PrepareAbort with a bumped epoch, or a decision left unfinished);
  -- {'open', deadline_ms}; {'idle'}: nothing to do.
  if h.state == 'Ongoing' then
    local deadline = num('started_ms') + num('timeout_ms')
    if now_ms < deadline then return {'open', deadline} end
    save({state = 'PrepareAbort', last_epoch = -1, epoch = math.min(num('epoch') + 1, MAX_EPOCH + 1)})
    return finish_reply()
  end
  if preparing then
    if now_ms - num('updated_ms', 0) < tonumber(ARGV[3]) then
      return {'open', num('updated_ms', 0) + tonumber(ARGV[3])}
    end
    return finish_reply()
  end
  return {'idle'}
end

return redis.error_reply('unknown txn operation ' .. tostring(op))

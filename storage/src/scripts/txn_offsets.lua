-- Offsets committed inside a transaction (TxnOffsetCommit): staged beside
-- the group's committed offsets, applied when the transaction commits,
-- dropped when it aborts. Each producer stages its own (two producers'
-- transactions may commit offsets of one partition at once; as in Kafka,
-- each producer's are kept apart and the commit applies that producer's),
-- by transaction number, so applying twice (a crashed gateway's commit
-- finished by another) changes nothing the second time.
--
-- A transaction's offset is applied only if it was staged after the
-- partition's committed offset was committed (offset_order.lua, the
-- prelude): Kafka keeps the later of the two.
--
-- KEYS[1] ketch:group:{GROUP}:offsets      committed offsets (see groups.rs)
-- KEYS[2] ketch:group:{GROUP}:txn-offsets  '<topic>:<partition>:<producer id>' ->
--         '<transaction number>:<length of the transactional id>:<transactional id><offset JSON>',
--         and fields 'order' (the last stage's order number) and 'applied'
-- KEYS[3] ketch:group:{GROUP}:state        the group's snapshot ('apply' only)
-- KEYS[4] ketch:group:{GROUP}:keep-until   ('apply' only) until when an offset's own
--         retention keeps the group's keys (keep_until.lua): a renewed TTL is
--         no shorter
-- ARGV[1] 'stage': ARGV[2] producer id, ARGV[3] transaction number,
--         ARGV[4] transactional id, then '<topic>:<partition>', offset JSON
--         pairs. Reply: the offsets staged.
-- ARGV[1] 'apply': ARGV[2] producer id, ARGV[3] transaction number,
--         ARGV[4] 'commit' or 'abort', ARGV[5] the offsets' retention (ms).
--         Reply: the offsets applied. Writes field 'applied' =
--         '<producer id>:<transaction number>' too. A group without members
--         keeps its offsets for the retention from its last commit (a TTL
--         on its keys, groups.rs): offsets applied here are a commit and
--         renew it, or the TTL an earlier plain commit set would remove them;
--         and they start it for a group that has no snapshot (no member ever
--         completed a rebalance in it: a standalone group), whose offsets
--         would otherwise never go. (A group whose first rebalance is under
--         way has no snapshot yet either; its first members' own commits
--         come after that rebalance, and so after its snapshot.)
-- ARGV[1] 'purge': then field, value pairs: each field is removed if it
--         still holds that value (staged offsets of a transaction that
--         ended without applying them). Reply: the fields removed.
--
-- A stage keeps KEYS[2] (PERSIST); once an apply or a purge leaves
-- nothing staged in it, it goes with the committed offsets: their TTL, or
-- deleted when there are none (its 'order' counter orders stages against
-- committed offsets, so it is not needed without either), so that it does
-- not outlive the group.
local function follow_offsets()
  local staged = redis.call('HLEN', KEYS[2])
    - redis.call('HEXISTS', KEYS[2], 'order')
    - redis.call('HEXISTS', KEYS[2], 'applied')
  if staged > 0 then
    return
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl == -2 then
    redis.call('DEL', KEYS[2])
  elseif ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end

local op = ARGV[1]
if op == 'stage' then
  -- Staged offsets stay until their transaction ends, whatever the
  -- group's retention (the 'apply' renews it).
  redis.call('PERSIST', KEYS[2])
  -- The next order number: above the last stage's, and above those of the
  -- partitions' committed offsets (should the counter have been lost).
  local order = current_order(KEYS[2])
  for i = 5, #ARGV, 2 do
    order = math.max(order, offset_order(redis.call('HGET', KEYS[1], ARGV[i])))
  end
  order = string.format('%d', order + 1)
  redis.call('HSET', KEYS[2], 'order', order)
  local staged = 0
  local prefix = ARGV[3] .. ':' .. string.format('%d', #ARGV[4]) .. ':' .. ARGV[4]
  for i = 5, #ARGV, 2 do
    redis.call('HSET', KEYS[2], ARGV[i] .. ':' .. ARGV[2], prefix .. with_order(ARGV[i + 1], order))
    staged = staged + 1
  end
  return staged
end
if op == 'apply' then
  local number = tonumber(ARGV[3])
  local suffix = ':' .. ARGV[2]
  local applied = 0
  local pending = redis.call('HGETALL', KEYS[2])
  for i = 1, #pending, 2 do
    local field, value = pending[i], pending[i + 1]
    if string.sub(field, -#suffix) == suffix then
      local n, length, rest = string.match(value, '^(%d+):(%d+):(.*)$')
      if n and tonumber(n) <= number then
        if ARGV[4] == 'commit' and tonumber(n) == number then
          local partition = string.sub(field, 1, #field - #suffix)
          local offset = string.sub(rest, tonumber(length) + 1)
          -- One staged by an older release has no number, and applies.
          local mine = offset_order(offset)
          if mine == 0 or mine > offset_order(redis.call('HGET', KEYS[1], partition)) then
            redis.call('HSET', KEYS[1], partition, offset)
            applied = applied + 1
          end
        end
        redis.call('HDEL', KEYS[2], field)
      end
    end
  end
  -- Always a write, so that a WAIT on this connection also covers an
  -- earlier apply of the same transaction (a finish tried again).
  redis.call('HSET', KEYS[2], 'applied', ARGV[2] .. ':' .. ARGV[3])
  if applied > 0 then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 or (ttl == -1 and redis.call('EXISTS', KEYS[3]) == 0) then
      local renewed = ARGV[5]
      local kept = KEYS[4] and redis.call('PTTL', KEYS[4]) or -2
      if kept > tonumber(renewed) then
        renewed = string.format('%d', kept)
      end
      for i = 1, 3 do
        redis.call('PEXPIRE', KEYS[i], renewed)
      end
    end
  end
  follow_offsets()
  return applied
end
if op == 'purge' then
  local removed = 0
  for i = 2, #ARGV, 2 do
    if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
      redis.call('HDEL', KEYS[2], ARGV[i])
      removed = removed + 1
    end
  end
  follow_offsets()
  return removed
end
return redis.error_reply('unknown txn_offsets operation ' .. tostring(op))

-- Offsets committed inside a transaction (TxnOffsetCommit): staged beside
-- the group's committed offsets, applied when the transaction commits,
-- dropped when it aborts. Staging and applying are by transaction number,
-- so applying twice (a crashed gateway's commit finished by another)
-- changes nothing the second time.
--
-- KEYS[1] ketch:group:{GROUP}:offsets      committed offsets (see groups.rs)
-- KEYS[2] ketch:group:{GROUP}:txn-offsets  'topic:partition' -> '<producer id>:<transaction number>:<offset JSON>'
-- ARGV[1] 'stage': ARGV[2] producer id, ARGV[3] transaction number, then
--         field, offset JSON pairs. Reply: the fields staged.
-- ARGV[1] 'apply': ARGV[2] producer id, ARGV[3] transaction number,
--         ARGV[4] 'commit' or 'abort'. Reply: the offsets applied.
local op = ARGV[1]
local prefix = ARGV[2] .. ':'
if op == 'stage' then
  local staged = 0
  for i = 4, #ARGV, 2 do
    redis.call('HSET', KEYS[2], ARGV[i], prefix .. ARGV[3] .. ':' .. ARGV[i + 1])
    staged = staged + 1
  end
  return staged
end
if op == 'apply' then
  local number = tonumber(ARGV[3])
  local applied = 0
  local pending = redis.call('HGETALL', KEYS[2])
  for i = 1, #pending, 2 do
    local field, value = pending[i], pending[i + 1]
    local pid, n, json = string.match(value, '^(%-?%d+):(%d+):(.*)$')
    if pid == ARGV[2] and tonumber(n) <= number then
      if ARGV[4] == 'commit' and tonumber(n) == number then
        redis.call('HSET', KEYS[1], field, json)
        applied = applied + 1
      end
      redis.call('HDEL', KEYS[2], field)
    end
  end
  return applied
end
return redis.error_reply('unknown txn_offsets operation ' .. tostring(op))

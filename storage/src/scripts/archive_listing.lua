-- Lists what the storage worker's archiving reads of a partition's sealed
-- segments, in one round trip.
--
-- KEYS[1] ketch:{TAG}:meta        (see seal.lua)
-- KEYS[2] ketch:{TAG}:segments    (see seal.lua)
-- KEYS[3] ketch:{TAG}:quarantine  (see segment_state.lua)
-- ARGV[1] 'all': every segment. Else the segments from the one holding the
--         local start on, or while the quarantine stream holds batches from
--         the one holding its oldest batch, if lower: below the local start
--         every segment is archived, quarantined or skipped (local
--         retention trims past no other), and one that still asks for work
--         there (quarantined, or its quarantined copy not yet deleted) has
--         batches in the quarantine stream, whose entry ids
--         (`<last offset>-<count>`) go in offset order. A remote topic keeps
--         a record per archived segment (with retention.ms -1, for ever),
--         and a tick must not read them all.
--
-- Reply: {log start offset, '0', the members from the one holding the
-- local start on, oldest first...}; {log start offset, '1', score} when
-- the segments from that score on are wanted ('-inf': all) with the
-- quarantine stream's oldest batch's among them, which the caller reads
-- with ZRANGE (handing tens of thousands of members through Lua costs
-- Redis ten times what ZRANGE does); {} when the partition does not
-- exist.
local meta = redis.call('HMGET', KEYS[1], 'log_start', 'local_start')
if not meta[1] then
  return {}
end
local log_start = tonumber(meta[1])
local local_start = math.max(tonumber(meta[2] or meta[1]), log_start)
if ARGV[1] == 'all' then
  return {string.format('%d', log_start), '1', '-inf'}
end
local from = local_start
local oldest = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
if oldest then
  local last = tonumber(string.match(oldest[1], '^(%d+)-'))
  if not last then
    return {string.format('%d', log_start), '1', '-inf'}
  end
  from = math.min(from, last)
end
local holding = redis.call('ZRANGE', KEYS[2], string.format('%d', from), '-inf', 'BYSCORE', 'REV',
  'LIMIT', 0, 1, 'WITHSCORES')
if oldest then
  return {string.format('%d', log_start), '1', holding[2] or '-inf'}
end
local reply = {string.format('%d', log_start), '0'}
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], holding[2] or '-inf', '+inf', 'BYSCORE')) do
  reply[#reply + 1] = member
end
return reply

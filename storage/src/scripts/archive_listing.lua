-- Lists what the storage worker's archiving reads of a partition's sealed
-- segments, in one round trip.
--
-- KEYS[1] ketch:{TAG}:meta        (see seal.lua)
-- KEYS[2] ketch:{TAG}:segments    (see seal.lua)
-- KEYS[3] ketch:{TAG}:quarantine  (see segment_state.lua)
-- ARGV[1] 'all': every segment. Else the segments from the one holding the
--         local start on, unless the quarantine stream holds batches: below
--         the local start every segment is archived, quarantined or skipped
--         (local retention trims past no other), and one that still asks
--         for work there (quarantined, or its quarantined copy not yet
--         deleted) has batches in the quarantine stream. A remote topic
--         keeps a record per archived segment (with retention.ms -1, for
--         ever), and a tick must not read them all.
--
-- Reply: {log start offset, '0', the members from the one holding the
-- local start on, oldest first...}; {log start offset, '1'} when every
-- segment is wanted, which the caller reads with ZRANGE (handing tens of
-- thousands of members through Lua costs Redis ten times what ZRANGE
-- does); {} when the partition does not exist.
local meta = redis.call('HMGET', KEYS[1], 'log_start', 'local_start')
if not meta[1] then
  return {}
end
local log_start = tonumber(meta[1])
local local_start = math.max(tonumber(meta[2] or meta[1]), log_start)
if ARGV[1] == 'all' or redis.call('XLEN', KEYS[3]) > 0 then
  return {string.format('%d', log_start), '1'}
end
local holding = redis.call('ZRANGE', KEYS[2], string.format('%d', local_start), '-inf', 'BYSCORE', 'REV',
  'LIMIT', 0, 1, 'WITHSCORES')
local reply = {string.format('%d', log_start), '0'}
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], holding[2] or '-inf', '+inf', 'BYSCORE')) do
  reply[#reply + 1] = member
end
return reply

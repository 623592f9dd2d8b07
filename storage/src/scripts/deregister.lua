-- Removes a gateway's registry entry at shutdown, if it is still this
-- process's (another process may hold the node id by now).
--
-- KEYS[1] ketch:brokers
-- ARGV[1] node id
-- ARGV[2] this process's instance id
-- ARGV[3] the channel told '<node id>' when the entry goes (see heartbeat.lua)
--
-- Reply: 1 if removed, 0 otherwise.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return 0
end
local ok, entry = pcall(cjson.decode, raw)
if ok and type(entry) == 'table' and entry.instance == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  if ARGV[3] then
    redis.call('SPUBLISH', ARGV[3], ARGV[1])
  end
  return 1
end
return 0

-- The next version of a set every gateway keeps a copy of (the ACLs, the
-- client quotas, the cluster-wide topic defaults), stored at `key`.
-- Gateways compare versions for equality only, so a version must never be
-- used twice: a counter alone would be, after a failover that lost the
-- last changes (the promoted replica's counter is behind), and a gateway
-- holding a lost version would take the next change's for its own and
-- never load it. So the version is the later of the counter's next value
-- and Redis's clock in microseconds (about 1.8e15 now; exact in Lua's
-- doubles below 2^53), which a lost version cannot match.
local function next_version(key)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local version = math.max(tonumber(redis.call('GET', key) or '0') + 1, clock)
  -- Written in full: Lua prints large numbers in exponent notation.
  local text = string.format('%d', version)
  redis.call('SET', key, text)
  return version, text
end

-- Registers a gateway in the broker registry, or refreshes its entry,
-- stamped with Redis's clock so gateways with skewed clocks still agree on
-- who is alive. An entry is a lease on its node id: it is live while its
-- heartbeat is younger than the node timeout, and no other process may
-- take the id while it is.
--
-- KEYS[1] ketch:brokers   hash: node id -> JSON {instance, host, port, rack,
--                         internal_host, internal_port, hostname, by_address, listeners, layout,
--                         heartbeat_ms}
-- ARGV[1] node id, or -1: claim the lowest id no live gateway holds
-- ARGV[2] this process's instance id (a UUID)
-- ARGV[3] the entry as JSON, without instance and heartbeat_ms
-- ARGV[4] node timeout (ms)
-- ARGV[5] largest node id that may be claimed
-- ARGV[6] the channel told '<node id>' when this process joins: its entry
--         was absent, another process's or expired ({ketch:brokers}:changed,
--         so it shares the registry's slot)
--
-- Reply: {1, node_id, now_ms, ''} once registered; {0, node_id, now_ms,
-- holder_entry} when another live process holds the node id (nothing is
-- written); {-1, -1, now_ms, ''} when every id up to ARGV[5] is held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local timeout = tonumber(ARGV[4])

-- The entry, decoded, when it belongs to another process that is alive.
local function live_other(raw)
  if not raw then
    return nil
  end
  local ok, entry = pcall(cjson.decode, raw)
  if not ok or type(entry) ~= 'table' or entry.instance == ARGV[2] then
    return nil
  end
  if type(entry.heartbeat_ms) ~= 'number' or now - entry.heartbeat_ms >= timeout then
    return nil
  end
  return entry
end

local id = tonumber(ARGV[1])
if id < 0 then
  local held = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local n = tonumber(all[i])
    if n and live_other(all[i + 1]) then
      held[n] = true
    end
  end
  id = 0
  while held[id] do
    id = id + 1
  end
  if id > tonumber(ARGV[5]) then
    return {-1, -1, now, ''}
  end
else
  local raw = redis.call('HGET', KEYS[1], id)
  if live_other(raw) then
    return {0, id, now, raw}
  end
end
-- Whether this process was live under the id already (a heartbeat), or
-- joins: the other gateways read the registry at once when told.
local joins = true
local prior = redis.call('HGET', KEYS[1], id)
if prior then
  local ok, old = pcall(cjson.decode, prior)
  joins = not (ok and type(old) == 'table' and old.instance == ARGV[2]
    and type(old.heartbeat_ms) == 'number' and now - old.heartbeat_ms < timeout)
end
local entry = cjson.decode(ARGV[3])
entry.instance = ARGV[2]
entry.heartbeat_ms = now
redis.call('HSET', KEYS[1], id, cjson.encode(entry))
if joins and ARGV[6] then
  redis.call('SPUBLISH', ARGV[6], string.format('%d', id))
end
return {1, id, now, ''}

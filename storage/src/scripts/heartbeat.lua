-- Records a gateway's heartbeat in the broker registry, stamped with
-- Redis's clock so gateways with skewed clocks still agree on who is alive.
--
-- KEYS[1] ketch:brokers   hash: node id -> JSON {instance, host, port, rack, heartbeat_ms}
-- ARGV[1] node id
-- ARGV[2] this process's instance id (a UUID)
-- ARGV[3] advertised host
-- ARGV[4] advertised port
-- ARGV[5] rack ('' for none)
--
-- Reply: {now_ms, previous_instance, previous_heartbeat_ms} ('' and -1 when
-- the node id was not registered), so the caller can tell that another live
-- gateway uses the same node id.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local previous = redis.call('HGET', KEYS[1], ARGV[1])
local previous_instance, previous_heartbeat = '', -1
if previous then
  local ok, record = pcall(cjson.decode, previous)
  if ok and type(record) == 'table' then
    previous_instance = record.instance or ''
    previous_heartbeat = record.heartbeat_ms or -1
  end
end
local record = {instance = ARGV[2], host = ARGV[3], port = tonumber(ARGV[4]), heartbeat_ms = now}
if ARGV[5] ~= '' then
  record.rack = ARGV[5]
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
return {now, previous_instance, previous_heartbeat}

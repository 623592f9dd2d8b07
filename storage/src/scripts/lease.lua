-- Takes, renews or releases a lease held by one storage worker: a
-- partition's storage-worker lease (ketch:{TAG}:lease) or its archiving
-- registration (ketch:{TAG}:archiving: held while the worker may write the
-- partition to the topic's Iceberg table; a purge of the table waits until
-- no partition has one, docs/architecture.md §7), or a topic's partition
-- growth lock (ketch:lock:partitions:<topic id>, held by one growth's token).
--
-- KEYS[1] the lease   string: the holder's worker id, with a TTL
-- ARGV[1] this worker's id
-- ARGV[2] lease time in ms
-- ARGV[3] 'take' (the default: take it if free, or renew it), 'renew'
--         (only if this worker still holds it) or 'release'
--
-- Reply: 1 when this worker holds it now ('release': when it did), else 0.
local holder = redis.call('GET', KEYS[1])
local op = ARGV[3] or 'take'
if op == 'release' then
  if holder == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if op == 'take' and not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0

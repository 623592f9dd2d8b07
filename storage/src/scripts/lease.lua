-- Takes or renews a partition's storage-worker lease.
--
-- KEYS[1] ketch:{TAG}:lease   string: the holder's instance id, with a TTL
-- ARGV[1] this worker's instance id
-- ARGV[2] lease time in ms
--
-- Reply: 1 when this worker holds the lease (taken or renewed), else 0.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0

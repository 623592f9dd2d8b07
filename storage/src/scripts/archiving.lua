-- A partition's archiving registration (docs/architecture.md §7): held by
-- the storage worker that may write the partition to the topic's Iceberg
-- table, from before it checks that remote storage is still on until it
-- stops. A worker that purges the table after remote storage was turned
-- off waits until no partition has one, so no commit lands after the purge.
--
-- KEYS[1] ketch:{TAG}:archiving   string: the holder's worker id, with a TTL
-- ARGV[1] this worker's id
-- ARGV[2] time to hold it, in ms
-- ARGV[3] 'take' (take it if free, or renew), 'renew' (only if still held)
--         or 'release'
--
-- Reply: 1 when this worker holds it now ('release': 1 when it did), else 0.
local holder = redis.call('GET', KEYS[1])
local op = ARGV[3]
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

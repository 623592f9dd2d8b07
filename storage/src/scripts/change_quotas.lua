-- Sets and removes client quotas (DescribeClientQuotas/AlterClientQuotas),
-- bumps the quota version and tells every gateway (they reload their quota
-- table on the message).
--
-- KEYS[1] ketch:{quotas}:entities   hash "<entity>\n<key>" -> value
-- KEYS[2] ketch:{quotas}:version    counter
-- ARGV[1] the change channel (sharded pub/sub, same hash tag)
-- ARGV[2..] pairs: field, value ("" removes the field)
--
-- Reply: the new version.
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local version = redis.call('INCR', KEYS[2])
redis.call('SPUBLISH', ARGV[1], version)
return version

-- Adds or removes ACL bindings, bumps the ACL version and tells every
-- gateway (they reload their ACL cache on the message).
--
-- KEYS[1] ketch:{security}:acls      hash binding (JSON) -> "1"
-- KEYS[2] ketch:{security}:version   the version (next_version.lua)
-- ARGV[1] "add" or "remove"
-- ARGV[2] the change channel (sharded pub/sub, same hash tag)
-- ARGV[3..] bindings
--
-- Reply: how many bindings were added or removed.
local changed = 0
for i = 3, #ARGV do
  if ARGV[1] == 'add' then
    changed = changed + redis.call('HSET', KEYS[1], ARGV[i], '1')
  else
    changed = changed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
local _, version = next_version(KEYS[2])
redis.call('SPUBLISH', ARGV[2], version)
return changed

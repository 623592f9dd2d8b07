-- Lists a group among those with committed offsets (`ketch:groups`), even
-- when Redis is at maxmemory (allow-oom): the commit that lists it is
-- stored already, and a member already listed grows nothing.
--
-- KEYS[1] ketch:groups   ARGV[1] the group
return redis.call('SADD', KEYS[1], ARGV[1])

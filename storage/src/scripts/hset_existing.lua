-- Sets a field of a hash only if the hash exists: a write that follows a
-- long step (the end of a compaction's trimming) must not bring back a
-- partition's metadata that a topic deletion removed meanwhile.
--
-- KEYS[1] the hash   ARGV[1] the field   ARGV[2] its value
-- Reply: 1 when set, 0 when the hash is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1

-- Replaces a topic record if it is still the one the caller read
-- (compare-and-set for CreatePartitions).
--
-- KEYS[1] ketch:topics
-- ARGV[1] topic name
-- ARGV[2] the record the caller read
-- ARGV[3] the new record
--
-- Reply: 1 when replaced, 0 when the record changed or vanished meanwhile.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1

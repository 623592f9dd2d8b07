-- Replaces a topic record if it is still the one the caller read
-- (compare-and-set for CreatePartitions and config changes), or with an
-- empty new record removes it (DeleteTopics: a topic re-created meanwhile,
-- under a new id, is not deleted).
--
-- KEYS[1] ketch:topics
-- ARGV[1] topic name
-- ARGV[2] the record the caller read
-- ARGV[3] the new record, or '' to remove it
--
-- Reply: 1 when replaced (removed), 0 when the record changed or vanished
-- meanwhile.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1

-- Replaces a topic record if it is still the one the caller read
-- (compare-and-set for CreatePartitions and config changes), or with an
-- empty new record removes it (DeleteTopics: a topic re-created meanwhile,
-- under a new id, is not deleted).
--
-- KEYS[1] ketch:topics
-- KEYS[2] (a removal only) {ketch:topics}:deleting, where the removed
--         record is kept until the partitions' keys and offsets are gone
-- ARGV[1] topic name
-- ARGV[2] the record the caller read
-- ARGV[3] the new record, or '' to remove it
-- ARGV[4] (a removal only) the topic id
-- ARGV[5] (a removal only) the deletion's entry in KEYS[2]
--
-- Reply: 1 when replaced (removed), 0 when the record changed or vanished
-- meanwhile.
--
-- Safe to run twice: a call sent again (the cluster connection re-sends a
-- command whose reply timed out, and Redis may have run the first) finds
-- the record it stored, or its removal's entry, and answers 1 again; the
-- caller would otherwise remove the partitions a growth just added.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] ~= '' and current == ARGV[3] then
  return 1
end
if ARGV[3] == '' and not current and KEYS[2]
    and redis.call('HGET', KEYS[2], ARGV[4]) == ARGV[5] then
  return 1
end
if current ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  if KEYS[2] then
    redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
  end
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1

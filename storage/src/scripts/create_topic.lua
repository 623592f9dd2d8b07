-- Creates a topic record unless the name is taken, or collides with
-- another topic's: Kafka refuses a name that equals an existing one once
-- '.' and '_' are taken for the same character (their metric names would
-- clash). Atomic, so two gateways creating "a.b" and "a_b" at once cannot
-- both succeed.
--
-- KEYS[1] ketch:topics
-- ARGV[1] topic name
-- ARGV[2] the new record
--
-- Reply: {'created'}, {'exists'} or {'collides', <the existing name>}.
--
-- Safe to run twice: a call sent again (the cluster connection re-sends a
-- command whose reply timed out, and Redis may have run the first) finds
-- its own record, carrying this creation's new topic id, and answers
-- 'created' again; the caller would otherwise remove the partitions of
-- the topic it made.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current == ARGV[2] then
  return {'created'}
end
if current then
  return {'exists'}
end
if string.find(ARGV[1], '[._]') then
  local wanted = string.gsub(ARGV[1], '%.', '_')
  for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.gsub(name, '%.', '_') == wanted then
      return {'collides', name}
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {'created'}

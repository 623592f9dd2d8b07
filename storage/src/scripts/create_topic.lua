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
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
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

-- Stores a consumer group's snapshot (what a new coordinator needs to take
-- the group over), unless a newer generation is stored: a coordinator that
-- lost the group (and has not noticed yet) must not overwrite what the
-- group's new coordinator wrote.
--
-- KEYS[1] ketch:group:{GROUP}:state   hash {generation, snapshot}
-- ARGV[1] generation
-- ARGV[2] snapshot (opaque bytes)
--
-- Reply: 1 if stored, 0 if a newer generation is stored. The key's TTL
-- (an empty group's retention) is kept.
local stored = tonumber(redis.call('HGET', KEYS[1], 'generation'))
if stored and stored > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'generation', ARGV[1], 'snapshot', ARGV[2])
return 1

-- Moves one transactional id's score in `ketch:transactions` only if it is
-- still the score the caller saw: the sweeper raises an id's score (to a
-- later deadline, or to idle) this way, so that a deadline a producer's
-- request set meanwhile (with ZADD LT, which only ever lowers a score, or
-- a plain ZADD when the request opened a transaction) is never lost; and
-- forgets an expired id this way, so that one a new producer took up
-- meanwhile stays listed.
--
-- KEYS[1] ketch:transactions
-- ARGV[1] the transactional id, ARGV[2] the score seen, ARGV[3] the new
--         score, or 'forget' to remove the id
-- Reply: 1 when moved (or removed), 0 when the score had changed.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  if ARGV[3] == 'forget' then
    redis.call('ZREM', KEYS[1], ARGV[1])
  else
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  end
  return 1
end
return 0

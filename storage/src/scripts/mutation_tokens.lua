-- Takes a client's controller mutation tokens (KIP-599's token bucket,
-- Kafka's controller keeps one per client for the whole cluster): they
-- refill at the quota's rate, up to the burst, by Redis's clock, so every
-- gateway draws on one bucket.
--
-- KEYS[1] ketch:{quotas}:mutations:<client>   hash: tokens, at (ms)
-- ARGV[1] the rate, tokens per second (> 0)
-- ARGV[2] the burst
-- ARGV[3] the tokens to take (the partitions created or deleted)
-- ARGV[4] '1' strict: take none when the tokens are below zero
--
-- Reply: {1 taken or 0 refused, the tokens left as a string}. The bucket
-- expires once it would be full again (a new one starts full).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local rate, burst, take = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, at = burst, now
local stored = redis.call('HMGET', KEYS[1], 'tokens', 'at')
if stored[1] and stored[2] then
  tokens, at = tonumber(stored[1]), tonumber(stored[2])
end
if now > at then
  tokens = math.min(burst, tokens + rate * (now - at) / 1000)
end
local taken = 1
if ARGV[4] == '1' and tokens < 0 then
  taken = 0
else
  tokens = math.min(burst, tokens - take)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {taken, string.format('%.17g', tokens)}

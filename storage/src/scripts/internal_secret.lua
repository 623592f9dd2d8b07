-- The secret gateways prove to each other on their internal listeners:
-- the one stored, else ARGV[1] (the caller's copy, or a fresh one), stored
-- and returned. A script so that it carries Redis's allow-oom flag
-- (lib.rs): every gateway reads the secret every few seconds, and a plain
-- SET NX would be refused (and counted among refused writes) while the
-- master holding it is full.
--
-- KEYS[1] ketch:{security}:internal-secret
-- ARGV[1] the secret to store if none is
local secret = redis.call('GET', KEYS[1])
if secret then
  return secret
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]

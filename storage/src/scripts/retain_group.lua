-- A group without members: its keys expire after the broker's retention,
-- or when the longest retention one of its offsets' commits asked for
-- ends (keep_until.lua's key, which expires then), whichever is later.
--
-- KEYS[1] ketch:group:{G}:keep-until
-- KEYS[2..] the keys that expire (offsets, snapshot, staged offsets)
-- ARGV[1] the broker's retention (ms, at least 1)
-- ARGV[2] '1': only keys that do not expire already (PEXPIRE … NX), and
--         those that expire before the keep-until key (a longer expiry
--         lost to a failover is written again)
-- Returns the time (ms since the Unix epoch) KEYS[2] expires at now: -1
-- when it does not expire, -2 when it does not exist.
local ttl = tonumber(ARGV[1])
local kept = redis.call('PTTL', KEYS[1])
if kept > ttl then
  ttl = kept
end
-- As an integer: Redis 7.0 would pass a large Lua number as 4.6e+18.
ttl = string.format('%d', ttl)
for i = 2, #KEYS do
  if ARGV[2] == '1' then
    redis.call('PEXPIRE', KEYS[i], ttl, 'NX')
    if kept > 0 then
      redis.call('PEXPIRE', KEYS[i], string.format('%d', kept), 'GT')
    end
  else
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return redis.call('PEXPIRETIME', KEYS[2])

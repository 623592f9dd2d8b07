-- Sets and removes fields of a hash that every gateway keeps a copy of (the
-- client quotas, the cluster-wide topic config defaults), bumps its version
-- and tells every gateway (they reload their copy on the message).
--
-- KEYS[1] the hash                  e.g. ketch:{quotas}:entities
-- KEYS[2] its version               (next_version.lua)
-- ARGV[1] the change channel (sharded pub/sub, same hash tag)
-- ARGV[2] the version the change was computed from; "" to change whatever
--         the version is
-- ARGV[3..] pairs: field, '=' followed by its value (which may be empty:
--         an empty list, say) to set it, or '-' to remove it
--
-- Reply: the new version, or -1 (nothing changed) when the version is not
-- ARGV[2].
if ARGV[2] ~= '' and tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[2]) then
  return -1
end
for i = 3, #ARGV, 2 do
  local change = ARGV[i + 1]
  if change == '-' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  elseif string.sub(change, 1, 1) == '=' then
    redis.call('HSET', KEYS[1], ARGV[i], string.sub(change, 2))
  else
    return redis.error_reply('ERR a change is =value or -, not ' .. change)
  end
end
local version, text = next_version(KEYS[2])
redis.call('SPUBLISH', ARGV[1], text)
return version

-- Sets each key's expiry again to what it is now, so that a write of
-- these keys reaches the replication stream after whatever set that
-- expiry on another connection: a WAIT on this script's connection then
-- covers that write too. acks=all confirms so the expiry a commit to a
-- group without members set (groups.rs, confirm_group_retention): the
-- coordinator's writer sets it in order with the group's other changes,
-- on the shared connection, which WAIT cannot be used on. A key without
-- an expiry (kept since: the group has members again) or gone needs
-- nothing confirmed.
--
-- KEYS the keys (of one slot)
-- Returns how many expiries were written again.
local written = 0
for i = 1, #KEYS do
  local at = redis.call('PEXPIRETIME', KEYS[i])
  if at > 0 then
    redis.call('PEXPIREAT', KEYS[i], at)
    written = written + 1
  end
end
return written

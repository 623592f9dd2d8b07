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
-- An expiry earlier than ARGV[1], the one that write set, is one a
-- failover brought back from before it (the write was lost with the old
-- master): the write's is set again, so what is confirmed is never the
-- earlier one.
--
-- KEYS the keys (of one slot)
-- ARGV[1] the time (ms since the Unix epoch) the write set; 0 if unknown
-- Returns how many expiries were written again.
local wanted = tonumber(ARGV[1]) or 0
local written = 0
for i = 1, #KEYS do
  local at = redis.call('PEXPIRETIME', KEYS[i])
  if at > 0 then
    if at < wanted then
      at = wanted
    end
    redis.call('PEXPIREAT', KEYS[i], string.format('%d', at))
    written = written + 1
  end
end
return written

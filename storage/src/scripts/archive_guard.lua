-- Readies a partition for remote storage being turned on (AlterConfigs):
-- refused if it was ever compacted (its compacted stream holds records the
-- archiver, which reads the log, cannot see), else any compaction pass on
-- it — under way, or left by a pass cut short (a crash, an error) — is
-- given up, in this one step: its swap then finds the pass no longer the
-- current one and changes nothing, so the log the archiver reads stays.
-- No pass may start or swap in for ARGV[2] ms after (`no_compaction_until`,
-- read by compact_add.lua and compact_swap.lua): the config turning remote
-- storage on is written meanwhile, and a pass begun in between would
-- otherwise see it off before its swap. With ARGV[1] 'check', nothing is
-- changed (validate_only).
--
-- KEYS[1] ketch:{TAG}:meta
-- KEYS[2] ketch:{TAG}:compacting
--
-- Reply: 1 compacted before (refused); 0 ready.
if tonumber(redis.call('HGET', KEYS[1], 'clean_end') or '0') > 0 then
  return 1
end
if ARGV[1] == 'check' then
  return 0
end
if redis.call('HDEL', KEYS[1], 'compacting_pass') == 1 then
  redis.call('UNLINK', KEYS[2])
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], 'no_compaction_until', ms + tonumber(ARGV[2]))
return 0

-- Readies a partition for remote storage being turned on (AlterConfigs):
-- refused if it was ever compacted (its compacted stream holds records the
-- archiver, which reads the log, cannot see), else any compaction pass on
-- it — under way, or left by a pass cut short (a crash, an error) — is
-- given up, in this one step: its swap then finds the pass no longer the
-- current one and changes nothing, so the log the archiver reads stays.
-- With ARGV[1] 'check', nothing is changed (validate_only).
--
-- KEYS[1] ketch:{TAG}:meta
-- KEYS[2] ketch:{TAG}:compacting
--
-- Reply: 1 compacted before (refused); 0 ready.
if tonumber(redis.call('HGET', KEYS[1], 'clean_end') or '0') > 0 then
  return 1
end
if ARGV[1] ~= 'check' and redis.call('HDEL', KEYS[1], 'compacting_pass') == 1 then
  redis.call('UNLINK', KEYS[2])
end
return 0

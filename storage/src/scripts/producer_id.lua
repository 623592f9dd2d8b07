-- The next producer id: INCR of `ketch:producer-ids`, as a script so that
-- it carries Redis's allow-oom flag (lib.rs). On a Redis Cluster the
-- counter is on one master; a plain INCR that master refuses once it is
-- full would fail every InitProducerId, also for producers whose
-- partitions live on masters with room. The counter does not grow.
--
-- KEYS[1] ketch:producer-ids
-- Reply: the counter after the step.
return redis.call('INCR', KEYS[1])

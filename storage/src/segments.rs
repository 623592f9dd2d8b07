//! Segments of a partition's log (DESIGN §7): the append script counts the
//! open segment's bytes exactly; `scripts/seal.lua` seals it on
//! `segment.bytes` / `segment.ms` into `ketch:{TAG}:segments` and, for
//! topics without remote storage, deletes whole sealed segments past
//! `retention.ms` / `retention.bytes`, moving the log start offset. A
//! per-partition lease (`scripts/lease.lua`) lets exactly one gateway's
//! storage worker do this at a time.

use std::time::Duration;

use serde::Deserialize;

use crate::topics::Topic;
use crate::{Result, StorageError, Store};

/// A sealed segment.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Segment {
    pub base: i64,
    pub last: i64,
    pub bytes: i64,
    pub max_ts: i64,
    pub sealed_ms: i64,
}

/// When to seal and what to keep, from the topic's configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPolicy {
    pub segment_bytes: i64,
    pub segment_ms: i64,
    /// -1: no limit.
    pub retention_ms: i64,
    /// -1: no limit.
    pub retention_bytes: i64,
    /// Delete expired segments from Redis (false while segments must wait
    /// to be archived).
    pub apply_retention: bool,
    /// Idempotent producer state idle longer than this is dropped
    /// (`producers.expiration`), in ms.
    pub producer_expiration_ms: i64,
}

/// What one pass over a partition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealOutcome {
    pub sealed: i64,
    pub deleted: i64,
    pub log_start_offset: i64,
    pub producers_expired: i64,
}

impl Store {
    /// Takes or renews this worker's lease on a partition; true while held.
    pub async fn take_lease(
        &self,
        topic: &Topic,
        partition: i32,
        worker: &str,
        ttl: Duration,
    ) -> Result<bool> {
        let keys = self.partition_keys(topic, partition);
        let held: i64 = self
            .scripts
            .lease
            .key(&keys.lease)
            .arg(worker)
            .arg(ttl.as_millis().max(1) as u64)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(held == 1)
    }

    /// Seals the open segment if due and applies retention.
    pub async fn seal_and_retain(
        &self,
        topic: &Topic,
        partition: i32,
        policy: SegmentPolicy,
    ) -> Result<SealOutcome> {
        let keys = self.partition_keys(topic, partition);
        let reply: Vec<i64> = self
            .scripts
            .seal
            .key(&keys.meta)
            .key(&keys.segments)
            .key(&keys.log)
            .key(&keys.producers)
            .arg(policy.segment_bytes)
            .arg(policy.segment_ms)
            .arg(policy.retention_ms)
            .arg(policy.retention_bytes)
            .arg(if policy.apply_retention { 1 } else { 0 })
            .arg(policy.producer_expiration_ms)
            .invoke_async(&mut self.conn())
            .await?;
        match reply[..] {
            [sealed, deleted, log_start_offset, producers_expired] => Ok(SealOutcome {
                sealed,
                deleted,
                log_start_offset,
                producers_expired,
            }),
            [-1] => Err(StorageError::UnknownTopicOrPartition),
            _ => Err(StorageError::Data(format!("seal script replied {reply:?}"))),
        }
    }

    /// The sealed segments of a partition, oldest first.
    pub async fn segments(&self, topic: &Topic, partition: i32) -> Result<Vec<Segment>> {
        let keys = self.partition_keys(topic, partition);
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&keys.segments)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await?;
        members
            .iter()
            .map(|m| serde_json::from_str(m).map_err(|e| StorageError::Data(format!("segment record: {e}"))))
            .collect()
    }
}

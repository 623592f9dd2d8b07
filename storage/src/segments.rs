//! Segments of a partition's log (DESIGN §7): the append script counts the
//! open segment's bytes exactly; `scripts/seal.lua` seals it on
//! `segment.bytes` / `segment.ms` into `ketch:{TAG}:segments`, deletes whole
//! sealed segments past `retention.ms` / `retention.bytes` (moving the log
//! start offset) and, for topics with remote storage, trims archived
//! segments from Redis past `local.retention.*` (moving the local start
//! offset). `scripts/archived.lua` records a segment's archive file. A
//! per-partition lease (`scripts/lease.lua`) lets exactly one gateway's
//! storage worker do this at a time.

use std::time::Duration;

use bytes::Bytes;
use redis::Value;
use serde::Deserialize;

use crate::log::stream_entries;
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
    /// The archive's data file, once archived.
    #[serde(default)]
    pub path: Option<String>,
    /// That file's size.
    #[serde(default)]
    pub file_bytes: Option<i64>,
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
    /// The topic has `remote.storage.enable`: segments are archived before
    /// any retention deletes them, and `local.retention.*` trims Redis.
    pub remote: bool,
    /// -1: no limit (a topic's -2 is resolved to retention.ms first).
    pub local_retention_ms: i64,
    /// -1: no limit (a topic's -2 is resolved to retention.bytes first).
    pub local_retention_bytes: i64,
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
    pub local_start_offset: i64,
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
            .arg(if policy.remote { 0 } else { 1 })
            .arg(policy.producer_expiration_ms)
            .arg(policy.local_retention_ms)
            .arg(policy.local_retention_bytes)
            .invoke_async(&mut self.conn())
            .await?;
        match reply[..] {
            [
                sealed,
                deleted,
                log_start_offset,
                producers_expired,
                local_start_offset,
            ] => Ok(SealOutcome {
                sealed,
                deleted,
                log_start_offset,
                producers_expired,
                local_start_offset,
            }),
            [-1] => Err(StorageError::UnknownTopicOrPartition),
            _ => Err(StorageError::Data(format!("seal script replied {reply:?}"))),
        }
    }

    /// Records that a sealed segment is archived in `path`; false when the
    /// segment is no longer there.
    pub async fn mark_archived(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        path: &str,
        file_bytes: u64,
    ) -> Result<bool> {
        let keys = self.partition_keys(topic, partition);
        let done: i64 = self
            .scripts
            .archived
            .key(&keys.segments)
            .arg(segment.base)
            .arg(segment.last)
            .arg(path)
            .arg(file_bytes)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(done == 1)
    }

    /// The sealed segment holding `offset`, if any.
    pub async fn segment_at(&self, topic: &Topic, partition: i32, offset: i64) -> Result<Option<Segment>> {
        let keys = self.partition_keys(topic, partition);
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&keys.segments)
            .arg(offset)
            .arg("-inf")
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut self.conn())
            .await?;
        let Some(member) = members.first() else {
            return Ok(None);
        };
        let segment = parse_segment(member)?;
        Ok((segment.last >= offset).then_some(segment))
    }

    /// The next batches of a sealed segment from offset `next` (at most
    /// `max_entries`), read from Redis with their base offsets set, and the
    /// offset after them (`segment.last + 1` at the end). Fails if Redis no
    /// longer holds the batch at `next`.
    pub async fn segment_chunk(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        next: i64,
        max_entries: usize,
    ) -> Result<(Vec<Bytes>, i64)> {
        let keys = self.partition_keys(topic, partition);
        let reply: Value = redis::cmd("XRANGE")
            .arg(&keys.log)
            .arg(next)
            .arg(segment.last)
            .arg("COUNT")
            .arg(max_entries.max(1))
            .query_async(&mut self.conn())
            .await?;
        let entries = stream_entries(reply)?;
        match entries.first() {
            Some(first) if first.last_offset - i64::from(first.record_count) + 1 == next => {}
            _ => {
                return Err(StorageError::Data(format!(
                    "segment {}..={}: Redis has no batch at offset {next}",
                    segment.base, segment.last
                )));
            }
        }
        let mut after = next;
        let batches = entries
            .into_iter()
            .map(|entry| {
                after = entry.last_offset + 1;
                entry.batch
            })
            .collect();
        Ok((batches, after))
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
        members.iter().map(|m| parse_segment(m)).collect()
    }
}

fn parse_segment(member: &str) -> Result<Segment> {
    serde_json::from_str(member).map_err(|e| StorageError::Data(format!("segment record: {e}")))
}

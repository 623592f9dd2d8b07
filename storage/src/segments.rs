//! Segments of a partition's log (DESIGN §7): the append script counts the
//! open segment's bytes exactly; `scripts/seal.lua` seals it on
//! `segment.bytes` / `segment.ms` into `ketch:{TAG}:segments`, deletes whole
//! sealed segments past `retention.ms` / `retention.bytes` (moving the log
//! start offset) and, for topics with remote storage, trims archived
//! segments from Redis past `local.retention.*` (moving the local start
//! offset). `scripts/segment_state.lua` records a segment's archive file, or
//! that the archive could not write it: such a segment is quarantined — its
//! batches copied to `ketch:{TAG}:quarantine`, so local retention can trim
//! the log past it while archiving goes on with later segments — until an
//! operator retries or skips it (`ketch segments`). A per-partition lease
//! (`scripts/lease.lua`) lets exactly one gateway's storage worker do this
//! at a time.

use std::time::Duration;

use bytes::Bytes;
use redis::{AsyncCommands, Value};
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
    /// Timestamps are the clients': Redis's JSON encoder writes those past
    /// 14 digits (±1e14 ms) as floats, read here saturated to i64.
    #[serde(deserialize_with = "timestamp")]
    pub max_ts: i64,
    pub sealed_ms: i64,
    /// The largest timestamp of its first batch (`max.compaction.lag.ms`
    /// counts from the oldest of the dirty segments'); `None` for a
    /// segment opened by a gateway of an older release.
    #[serde(default, deserialize_with = "some_timestamp")]
    pub first_ts: Option<i64>,
    /// The archive's data file, once archived; empty for a segment of no
    /// committed records (transaction markers and aborted transactions
    /// only), archived without a file.
    #[serde(default)]
    pub path: Option<String>,
    /// That file's size.
    #[serde(default)]
    pub file_bytes: Option<i64>,
    /// Set while the archive cannot write the segment.
    #[serde(default)]
    pub quarantine: Option<Quarantine>,
    /// Set once an operator gave up on archiving it: its records are gone
    /// (a hole in the partition's offsets).
    #[serde(default)]
    pub skipped: Option<Skipped>,
    /// Skipped once it was archived: its data file was lost. The archive
    /// held it, so the last archived offset (ListOffsets -5) counts it.
    #[serde(default)]
    pub lost: bool,
    /// Archived after a quarantine, or skipped, and its copy in the
    /// quarantine stream not yet known deleted ([`Store::purge_quarantine`]).
    #[serde(default)]
    pub purge: bool,
    /// Offsets the archive's data file has no rows for, as sorted inclusive
    /// ranges: transaction markers and aborted transactions' records,
    /// filtered out when the segment was archived.
    #[serde(default)]
    pub holes: Vec<(i64, i64)>,
    /// Compacted segments: the bytes the log held before compaction
    /// (`bytes` is then what the compacted stream holds of it).
    #[serde(default)]
    pub log_bytes: Option<i64>,
    /// When a compaction pass first compacted it (Unix ms): its tombstones
    /// and transaction markers are kept `delete.retention.ms` from then,
    /// Kafka's delete horizon; `None` before that, and for a segment an
    /// older release compacted (its seal time counts then).
    #[serde(default)]
    pub compacted_ms: Option<i64>,
}

/// A timestamp of a segment record: an integer, or a float (what
/// `cjson.encode` makes of one past 14 significant digits) saturated to
/// i64. A client may send any timestamp its topic's bounds let through,
/// and one refused here failed every read of the partition's segments
/// (archiving, compaction, ListOffsets -5) for good.
fn timestamp<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Int(i64),
        Float(f64),
    }
    Ok(match Number::deserialize(deserializer)? {
        Number::Int(n) => n,
        // `as` saturates (and makes NaN 0).
        Number::Float(f) => f as i64,
    })
}

fn some_timestamp<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<i64>, D::Error> {
    timestamp(deserializer).map(Some)
}

/// Why and since when a segment is quarantined.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Quarantine {
    pub reason: String,
    /// Redis time, ms.
    pub at: i64,
    /// An operator asked for another attempt.
    #[serde(default)]
    pub retry: bool,
}

/// A quarantined segment an operator skipped.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Skipped {
    /// The operator's reason.
    pub reason: String,
    /// Redis time, ms.
    pub at: i64,
    /// Why it was quarantined.
    pub error: String,
}

impl Segment {
    /// Whether the storage worker should (try to) archive it now.
    pub fn wants_archiving(&self) -> bool {
        self.path.is_none() && self.skipped.is_none() && self.quarantine.as_ref().is_none_or(|q| q.retry)
    }
}

/// A partition's sealed segments as archiving reads them
/// ([`Store::archive_listing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveListing {
    pub log_start_offset: i64,
    /// Every segment that may want work is listed, and the one holding
    /// the quarantine stream's oldest batch (all of them when asked for
    /// all); else those below the local start are left out, none of which
    /// wants work, and the quarantine stream is empty.
    pub complete: bool,
    /// Oldest first.
    pub segments: Vec<Segment>,
}

/// Where a sealed segment's batches are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The partition's log.
    Log,
    /// The quarantine stream (quarantined segments).
    Quarantine,
}

/// A change to a segment's state (`scripts/segment_state.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentChange<'a> {
    Archived {
        path: &'a str,
        file_bytes: u64,
        holes: &'a [(i64, i64)],
    },
    Quarantine {
        reason: &'a str,
    },
    Retry,
    Skip {
        reason: &'a str,
        /// The caller holds the partition's archiving registration
        /// ([`Lease::Archiving`]): no worker can be archiving the segment,
        /// so a requested retry does not hold the skip back.
        held: bool,
    },
    /// The offsets the archived segment's data file at `path` has no rows
    /// for, recorded again (read off the file: an older release could
    /// record them wrong).
    Holes {
        path: &'a str,
        holes: &'a [(i64, i64)],
    },
    /// Its copy in the quarantine stream is deleted (clears `purge`).
    Purged,
    /// Gives up on an archived segment whose data file at `path` the
    /// object store lost (its batches no longer in Redis): it becomes
    /// skipped, a hole, and forgets the file.
    Lost {
        reason: &'a str,
        path: &'a str,
    },
}

/// What a [`SegmentChange`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentChanged {
    Done,
    /// No such segment (retention, DeleteRecords or topic deletion took it).
    Gone,
    /// The segment is archived already.
    Archived,
    /// Retry and skip need a quarantined segment.
    NotQuarantined,
    /// Skip waits for a requested retry to end (archived, or quarantined
    /// again): the storage worker may be archiving the segment.
    RetryPending,
    /// Lost needs a segment archived in that data file.
    NotArchived,
}

impl redis::FromRedisValue for SegmentChanged {
    fn from_redis_value(v: Value) -> std::result::Result<Self, redis::ParsingError> {
        let tag = match &v {
            Value::BulkString(tag) => tag.as_slice(),
            Value::SimpleString(tag) => tag.as_bytes(),
            _ => b"",
        };
        Ok(match tag {
            b"ok" => SegmentChanged::Done,
            b"gone" => SegmentChanged::Gone,
            b"archived" => SegmentChanged::Archived,
            b"not_quarantined" => SegmentChanged::NotQuarantined,
            b"retry_pending" => SegmentChanged::RetryPending,
            b"not_archived" => SegmentChanged::NotArchived,
            _ => return Err(format!("segment_state script replied {v:?}").into()),
        })
    }
}

/// Stream entries copied or deleted per round trip.
const QUARANTINE_CHUNK: usize = 256;
/// The most room a segment read makes at once for its reply
/// ([`Store::segment_chunk`]): one large batch among many small ones must
/// not make it reserve the small ones' count of large ones (a longer
/// reply still arrives whole, growing the buffer as it comes).
const MAX_CHUNK_ROOM: usize = 16 * 1024 * 1024;

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
    /// The topic's `remote.storage.enable` is off and its archive is being
    /// deleted (`drop_archive`): what the archive held is let go (the log
    /// start moves to the local start, segments forget their archive
    /// files).
    pub no_archive: bool,
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

/// A partition's leases, each held by one storage worker at a time
/// (`scripts/lease.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// `ketch:{TAG}:lease`: the worker that seals, archives, applies
    /// retention to and compacts the partition.
    Worker,
    /// `ketch:{TAG}:archiving`: the worker that may write the partition to
    /// the topic's Iceberg table. Taken before the worker checks that the
    /// topic still has remote storage, held until it stops writing; a
    /// purge of the table waits until no partition has one.
    Archiving,
}

impl Lease {
    fn key(self, keys: &crate::keys::PartitionKeys) -> &str {
        match self {
            Lease::Worker => &keys.lease,
            Lease::Archiving => &keys.archiving,
        }
    }
}

impl Store {
    /// Takes `lease` on a partition for this worker, or renews it; true
    /// while held.
    pub async fn take_lease(
        &self,
        lease: Lease,
        topic: &Topic,
        partition: i32,
        worker: &str,
        ttl: Duration,
    ) -> Result<bool> {
        self.lease_op(
            lease.key(self.partition_keys(topic, partition)),
            worker,
            ttl,
            "take",
        )
        .await
    }

    /// Renews `lease` only if this worker still holds it: false once it
    /// was released or expired. The worker lease is released when the
    /// worker stops leading the partition or its gateway stops; a lapsed
    /// archiving registration means a purge of the table may have run.
    pub async fn renew_lease(
        &self,
        lease: Lease,
        topic: &Topic,
        partition: i32,
        worker: &str,
        ttl: Duration,
    ) -> Result<bool> {
        self.lease_op(
            lease.key(self.partition_keys(topic, partition)),
            worker,
            ttl,
            "renew",
        )
        .await
    }

    /// Gives up `lease`, if this worker holds it: the worker lease goes to
    /// the partition's new leader on its next tick rather than after
    /// `tiering.lease_ttl`.
    pub async fn release_lease(
        &self,
        lease: Lease,
        topic: &Topic,
        partition: i32,
        worker: &str,
    ) -> Result<()> {
        let keys = self.partition_keys(topic, partition);
        self.lease_op(lease.key(keys), worker, Duration::ZERO, "release")
            .await
            .map(drop)
    }

    /// Whether some worker holds `lease` on the partition.
    pub async fn lease_held(&self, lease: Lease, topic: &Topic, partition: i32) -> Result<bool> {
        let keys = self.partition_keys(topic, partition);
        Ok(self.conn().exists(lease.key(keys)).await?)
    }

    /// Runs `scripts/lease.lua` on `lease`: `op` is take, renew or release.
    pub(crate) async fn lease_op(&self, lease: &str, worker: &str, ttl: Duration, op: &str) -> Result<bool> {
        let held: i64 = self
            .scripts
            .lease
            .key(lease)
            .arg(worker)
            .arg(crate::groups::retention_ms(ttl))
            .arg(op)
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
            .key(&keys.quarantine)
            .key(&keys.aborted)
            .key(&keys.clean)
            .key(&keys.times)
            .arg(policy.segment_bytes)
            .arg(policy.segment_ms)
            .arg(policy.retention_ms)
            .arg(policy.retention_bytes)
            .arg(if policy.remote { 0 } else { 1 })
            .arg(policy.producer_expiration_ms)
            .arg(policy.local_retention_ms)
            .arg(policy.local_retention_bytes)
            .arg(if policy.no_archive { 1 } else { 0 })
            .arg(&keys.wake)
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

    /// Records that a sealed segment is archived in `path` (ending its
    /// quarantine, if it was quarantined); false when the segment is no
    /// longer there.
    pub async fn mark_archived(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        path: &str,
        file_bytes: u64,
        holes: &[(i64, i64)],
    ) -> Result<bool> {
        let change = SegmentChange::Archived {
            path,
            file_bytes,
            holes,
        };
        Ok(self.change_segment(topic, partition, segment, change).await? != SegmentChanged::Gone)
    }

    /// Changes a segment's state.
    pub async fn change_segment(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        change: SegmentChange<'_>,
    ) -> Result<SegmentChanged> {
        let keys = self.partition_keys(topic, partition);
        let mut invocation = self.scripts.segment_state.key(&keys.segments);
        invocation.arg(segment.base).arg(segment.last);
        match change {
            SegmentChange::Archived {
                path,
                file_bytes,
                holes,
            } => {
                let holes = serde_json::to_string(holes).expect("holes serialize");
                invocation.arg("archived").arg(path).arg(file_bytes).arg(holes);
            }
            SegmentChange::Quarantine { reason } => {
                invocation.arg("quarantine").arg(reason);
            }
            SegmentChange::Retry => {
                invocation.arg("retry");
            }
            SegmentChange::Skip { reason, held } => {
                invocation.arg("skip").arg(reason);
                if held {
                    invocation.arg("held");
                }
            }
            SegmentChange::Holes { path, holes } => {
                let holes = serde_json::to_string(holes).expect("holes serialize");
                invocation.arg("holes").arg(path).arg(holes);
            }
            SegmentChange::Purged => {
                invocation.arg("purged");
            }
            SegmentChange::Lost { reason, path } => {
                invocation.arg("lost").arg(reason).arg(path);
            }
        }
        Ok(invocation.invoke_async(&mut self.conn()).await?)
    }

    /// Copies a sealed segment's batches from the log to the quarantine
    /// stream, a chunk at a time; resumes where an interrupted copy stopped.
    /// Call before quarantining the segment: local retention trims the log
    /// past a quarantined segment.
    pub async fn copy_to_quarantine(&self, topic: &Topic, partition: i32, segment: &Segment) -> Result<()> {
        let keys = self.partition_keys(topic, partition);
        let mut conn = self.conn();
        let newest: Value = redis::cmd("XREVRANGE")
            .arg(&keys.quarantine)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await?;
        let mut next = match stream_entries(newest)?.first() {
            Some(entry) if entry.last_offset >= segment.last => return Ok(()),
            Some(entry) => (entry.last_offset + 1).max(segment.base),
            None => segment.base,
        };
        while next <= segment.last {
            let (batches, after) = self
                .segment_chunk(topic, partition, segment, Tier::Log, next, QUARANTINE_CHUNK, None)
                .await?;
            // All of a chunk or none of it (MULTI/EXEC): a resumed copy
            // starts after the newest entry, so one XADD refused (Redis at
            // maxmemory) between two accepted would leave a hole for good.
            let mut pipe = redis::pipe();
            pipe.atomic();
            for batch in &batches {
                let header = crate::batch::header(batch)?;
                let base = i64::from_be_bytes(batch[0..8].try_into().expect("8 bytes"));
                let id = format!(
                    "{}-{}",
                    base + i64::from(header.record_count) - 1,
                    header.record_count
                );
                pipe.cmd("XADD")
                    .arg(&keys.quarantine)
                    .arg(id)
                    .arg("b")
                    .arg(&batch[..])
                    .arg("t")
                    .arg(header.max_timestamp)
                    .ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
            next = after;
        }
        Ok(())
    }

    /// The last offset of the oldest batch in the partition's quarantine
    /// stream, if it holds any.
    pub async fn oldest_quarantined_offset(&self, topic: &Topic, partition: i32) -> Result<Option<i64>> {
        let keys = self.partition_keys(topic, partition);
        let reply: Value = redis::cmd("XRANGE")
            .arg(&keys.quarantine)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn())
            .await?;
        let Some(Value::BulkString(id)) = stream_ids(reply)?.into_iter().next() else {
            return Ok(None);
        };
        let (last, _) = crate::log::parse_entry_id(&id).ok_or_else(|| {
            StorageError::Data(format!(
                "quarantine stream entry id {:?}",
                String::from_utf8_lossy(&id)
            ))
        })?;
        Ok(Some(last))
    }

    /// Deletes a segment's batches from the quarantine stream (after it was
    /// archived or skipped), a chunk at a time, then clears its `purge`.
    pub async fn purge_quarantine(&self, topic: &Topic, partition: i32, segment: &Segment) -> Result<()> {
        let keys = self.partition_keys(topic, partition);
        let mut conn = self.conn();
        loop {
            let reply: Value = redis::cmd("XRANGE")
                .arg(&keys.quarantine)
                .arg(segment.base)
                .arg(format!("{}-{}", segment.last, u64::MAX))
                .arg("COUNT")
                .arg(QUARANTINE_CHUNK)
                .query_async(&mut conn)
                .await?;
            let ids = stream_ids(reply)?;
            if ids.is_empty() {
                self.change_segment(topic, partition, segment, SegmentChange::Purged)
                    .await?;
                return Ok(());
            }
            let mut xdel = redis::cmd("XDEL");
            xdel.arg(&keys.quarantine);
            for id in &ids {
                if let Value::BulkString(id) = id {
                    xdel.arg(&id[..]);
                }
            }
            let _: i64 = xdel.query_async(&mut conn).await?;
        }
    }

    /// Batches of a quarantined segment from `offset` on, read from the
    /// quarantine stream until about `max_bytes` are gathered (at least one).
    pub async fn read_quarantined(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut next = offset;
        while next <= segment.last && (out.is_empty() || bytes < max_bytes) {
            let (batches, after) = self
                .segment_chunk(topic, partition, segment, Tier::Quarantine, next, 4, None)
                .await?;
            for batch in batches {
                if !out.is_empty() && bytes + batch.len() > max_bytes {
                    return Ok(out);
                }
                bytes += batch.len();
                out.push(batch);
            }
            next = after;
        }
        Ok(out)
    }

    /// The first record of a quarantined segment from `from` on whose
    /// timestamp satisfies `pred`, as (offset, timestamp), read from the
    /// quarantine stream: a lookup by time below the local start searches
    /// what Fetch serves there. Batches are decoded in place (a
    /// quarantined segment is rare, and read a few entries at a time).
    pub async fn find_quarantined(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        from: i64,
        mut pred: impl FnMut(i64) -> bool,
    ) -> Result<Option<(i64, i64)>> {
        let keys = self.partition_keys(topic, partition);
        let mut next = from.max(segment.base);
        let mut scan = crate::log::Scan {
            start: next,
            visit: |ts| (pred(ts), ()),
            last: None,
        };
        while next <= segment.last {
            let mut xrange = redis::cmd("XRANGE");
            xrange
                .arg(&keys.quarantine)
                .arg(next)
                .arg(segment.last)
                .arg("COUNT")
                .arg(crate::log::SCAN_READ_COUNT);
            let entries = self.read_entries(keys, xrange, 0).await?;
            let Some(last) = entries.last() else {
                break;
            };
            next = last.last_offset + 1;
            if let Some(found) = scan.entries(&entries)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
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

    /// The next batches of a sealed segment from the batch holding offset
    /// `next` (at most `max_entries`), read from `tier` with their base
    /// offsets set, and the offset after them (`segment.last + 1` at the
    /// end). Fails if Redis no longer holds the batch at `next`.
    /// `largest_batch`: about the largest batch the read may return, where
    /// the caller knows (the last chunk's): the connection then makes room
    /// for the whole reply at once, instead of growing its read buffer
    /// twofold and moving what arrived each time.
    #[allow(clippy::too_many_arguments)]
    pub async fn segment_chunk(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        tier: Tier,
        next: i64,
        max_entries: usize,
        largest_batch: Option<usize>,
    ) -> Result<(Vec<Bytes>, i64)> {
        let keys = self.partition_keys(topic, partition);
        let key = match tier {
            Tier::Log => &keys.log,
            Tier::Quarantine => &keys.quarantine,
        };
        let mut xrange = redis::cmd("XRANGE");
        xrange
            .arg(key)
            .arg(next)
            .arg(segment.last)
            .arg("COUNT")
            .arg(max_entries.max(1));
        let expect = largest_batch.map_or(0, |largest| {
            crate::log::reply_bytes(max_entries.max(1), largest).min(MAX_CHUNK_ROOM)
        });
        let entries = self.read_entries(keys, xrange, expect).await?;
        match entries.first() {
            Some(first)
                if first.last_offset - i64::from(first.record_count) < next && first.last_offset >= next => {}
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

    /// What the storage worker's archiving reads of a partition's sealed
    /// segments (`scripts/archive_listing.lua`): all of them when `all`,
    /// else those from the one holding the local start on, or from the one
    /// holding the quarantine stream's oldest batch when that is lower (a
    /// segment there may still want work). The segments of a partition
    /// that does not exist are none.
    pub async fn archive_listing(&self, topic: &Topic, partition: i32, all: bool) -> Result<ArchiveListing> {
        let keys = self.partition_keys(topic, partition);
        let reply: Vec<String> = self
            .scripts
            .archive_listing
            .key(&keys.meta)
            .key(&keys.segments)
            .key(&keys.quarantine)
            .arg(if all { "all" } else { "from_local" })
            .invoke_async(&mut self.conn())
            .await?;
        let mut reply = reply.into_iter();
        let (Some(log_start), Some(complete)) = (reply.next(), reply.next()) else {
            return Ok(ArchiveListing {
                log_start_offset: 0,
                complete: true,
                segments: Vec::new(),
            });
        };
        let log_start_offset = log_start
            .parse()
            .map_err(|_| StorageError::Data(format!("archive listing replied log start {log_start:?}")))?;
        let complete = complete == "1";
        let segments = if complete {
            let from = reply.next().unwrap_or_else(|| "-inf".to_owned());
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&keys.segments)
                .arg(&from)
                .arg("+inf")
                .arg("BYSCORE")
                .query_async(&mut self.conn())
                .await?;
            members.iter().map(|m| parse_segment(m)).collect::<Result<_>>()?
        } else {
            reply.map(|m| parse_segment(&m)).collect::<Result<_>>()?
        };
        Ok(ArchiveListing {
            log_start_offset,
            complete,
            segments,
        })
    }

    /// The sealed segments of a partition, oldest first.
    pub async fn segments(&self, topic: &Topic, partition: i32) -> Result<Vec<Segment>> {
        let keys = self.partition_keys(topic, partition);
        Ok(self.segment_members(&keys.segments).await?.1)
    }

    /// The members of a segments set as stored, oldest first, and parsed.
    pub(crate) async fn segment_members(&self, key: &str) -> Result<(Vec<String>, Vec<Segment>)> {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await?;
        let segments = members.iter().map(|m| parse_segment(m)).collect::<Result<_>>()?;
        Ok((members, segments))
    }
}

/// The entry ids of an XRANGE reply.
fn stream_ids(reply: Value) -> Result<Vec<Value>> {
    let Value::Array(items) = reply else {
        return Err(StorageError::Data("XRANGE reply is not an array".to_owned()));
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::Array(mut pair) if pair.len() == 2 => Ok(pair.swap_remove(0)),
            _ => Err(StorageError::Data("stream entry is not [id, fields]".to_owned())),
        })
        .collect()
}

pub(crate) fn parse_segment(member: &str) -> Result<Segment> {
    serde_json::from_str(member).map_err(|e| StorageError::Data(format!("segment record: {e}")))
}

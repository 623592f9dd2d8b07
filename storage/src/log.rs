//! A partition's log: append, read, offsets, time lookups, DeleteRecords.
//!
//! Stream entry ids are `<last_offset>-<record_count>`, so `XRANGE log X +`
//! starts at the batch holding offset X and the id alone gives the batch's
//! offset range. Offsets are assigned by `scripts/append.lua`, atomically,
//! so any number of gateways appending to one partition get dense offsets.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use redis::Value;

use crate::batch::{self, BatchHeader, Records};
use crate::connection::Conn;
use crate::durable;
use crate::keys::PartitionKeys;
use crate::topics::Topic;
use crate::wire::{Packed, Reply, Wire};
use crate::{Result, SequenceError, StorageError, Store};

/// Kafka's `index.interval.bytes`: bytes between two time index entries.
pub(crate) const TIME_INDEX_INTERVAL_BYTES: u64 = 4096;
/// Stream entries read per XRANGE of a timestamp scan.
pub(crate) const SCAN_READ_COUNT: usize = 8;
/// Entries the first read of a partition asks for at most, before its
/// batch sizes are known.
const FIRST_READ_COUNT: usize = 8;
const MAX_READ_COUNT: usize = 1024;
/// Batches up to this size pass through the append script in one call:
/// below it, Lua hashing the bytes costs less than a separate XADD.
const INLINE_BATCH_BYTES: usize = 4096;

/// What an `XRANGE` reply adds to each entry's batch: the entry's id, the
/// field names, the timestamp and RESP's headers.
const ENTRY_FRAMING_BYTES: usize = 96;
/// Times an append in cluster mode follows a moved slot before it gives up
/// (a retriable error to the client).
const MAX_MOVED_RETRIES: u64 = 8;
/// Reserve attempts before an append of a large batch gives up (another
/// gateway kept appending to the same partition in between; a small batch
/// is stored at the next offset the script finds, in one attempt).
const MAX_APPEND_ATTEMPTS: usize = 16;
/// Reserve attempts a large batch makes before it goes through the script
/// whole, like a small one: the script then stores it at the next offset
/// it finds, so a partition other gateways keep appending to cannot refuse
/// it (hashing its bytes in Lua costs more than one more round trip).
const STAGED_ATTEMPTS: usize = 3;

/// Batches the reads of a partition must have seen before their sizes,
/// rather than `max.message.bytes`, bound how many entries a read asks for.
const TRUSTED_SAMPLES: usize = 32;
/// A read that fits this many average batches asks for one more: the
/// extra one costs at most an eighth of the read and saves a round trip
/// when the batches run a little smaller than the average. A read of fewer,
/// larger batches asks for no more than fit: the extra one would be read
/// only to be dropped.
const SLACK_FROM: usize = 8;

/// Entries to ask one XRANGE for, to gather `bytes` more: as many as the
/// bytes hold batches of the partition's average size (of the largest
/// seen, until [`TRUSTED_SAMPLES`] are seen); 0 when not one such batch
/// fits and the request already has some (`first` is false): a fetch may
/// return less than its limit, and reading a batch only to drop it costs
/// more than the client's next fetch. Where the partition's size classes
/// say every batch read is at least `range.smallest`, the count assumes
/// no smaller average (batches grew since the average was learnt).
///
/// Nothing bounds what XRANGE returns but the count, so the count also
/// keeps the read within `cap` (the fetch's remaining response budget, at
/// least `bytes`), or one batch, should every entry be `range.largest`:
/// the largest a batch of the range read may be (from the size classes,
/// else `max.message.bytes`). Until reads have seen [`TRUSTED_SAMPLES`]
/// batches, the count keeps within `bytes` too, or as many entries as
/// batches seen.
fn entries_for(bytes: usize, cap: usize, sizes: Option<BatchSizes>, range: SizeBounds, first: bool) -> usize {
    let cap = cap.max(bytes);
    let largest = range.largest.max(1);
    let sizes = sizes.map(|sizes| BatchSizes {
        average: sizes.average.max(range.smallest),
        ..sizes
    });
    let (per_batch, bound) = match sizes {
        Some(sizes) if sizes.seen >= TRUSTED_SAMPLES => (sizes.average, cap / largest),
        // Sizes not known yet: the read also keeps to the bytes wanted,
        // growing with the batches seen, so a partition's first fetch does
        // not read a budget's worth of large batches to send one.
        _ => {
            let seen = sizes.map_or(0, |sizes| sizes.seen);
            let seen_largest = sizes.map_or(largest, |sizes| sizes.largest);
            let largest = largest.max(seen_largest);
            (seen_largest, (cap / largest).min((bytes / largest).max(seen)))
        }
    };
    let wanted = match sizes {
        None => FIRST_READ_COUNT,
        Some(_) => match bytes / per_batch.max(1) {
            0 if first => 1,
            0 => return 0,
            fit if fit >= SLACK_FROM => fit + 1,
            fit => fit,
        },
    };
    wanted.min(bound.max(1)).clamp(1, MAX_READ_COUNT)
}

/// What the batches of a range read may be, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SizeBounds {
    smallest: usize,
    largest: usize,
}

impl SizeBounds {
    /// Nothing known but that no batch exceeds `max.message.bytes`.
    fn at_most(largest: usize) -> SizeBounds {
        SizeBounds { smallest: 0, largest }
    }
}

/// The batch sizes reads have seen on a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchSizes {
    /// The mean of the first [`TRUSTED_SAMPLES`] batches, then a moving
    /// average: batch sizes drift with the producers' load.
    average: usize,
    /// The largest seen lately: decays toward what reads see now, so one
    /// outlier does not slow reads of the partition for good.
    largest: usize,
    /// How many batches reads have seen (saturating).
    seen: usize,
}

impl BatchSizes {
    fn learn(&mut self, read: BatchSizes) {
        let seen = self.seen.saturating_add(read.seen);
        self.average = if self.seen < TRUSTED_SAMPLES {
            (self.average * self.seen + read.average * read.seen) / seen.max(1)
        } else {
            (self.average * 3 + read.average) / 4
        };
        self.largest = read.largest.max(self.largest - self.largest / 8);
        self.seen = seen;
    }
}

/// The smallest and largest size class the append script keeps
/// (`scripts/append.lua`): class k holds batches of 2^k to 2^(k+1) - 1
/// bytes, the smallest class every smaller batch too.
const SMALLEST_CLASS: u32 = 6;
const LARGEST_CLASS: u32 = 30;
const CLASSES: usize = (LARGEST_CLASS - SMALLEST_CLASS + 1) as usize;

/// A partition's size classes as one read found them: for the batches from
/// offset `from` to `to` (exclusive), the last offset of the newest batch
/// of each class. The batches of that range never change (a log only
/// grows at its end and is trimmed at its start), so what a read found
/// stays true for later reads of the range.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SizeClasses {
    from: i64,
    to: i64,
    /// (class, last offset of its newest batch), classes that have one.
    newest: Vec<(u32, i64)>,
}

impl SizeClasses {
    /// Parses the `sized_from`, `sized_to` and `sz<k>` fields of meta.
    fn parse(fields: &[Option<i64>]) -> Option<SizeClasses> {
        let [Some(from), Some(to), classes @ ..] = fields else {
            return None;
        };
        let newest = (SMALLEST_CLASS..)
            .zip(classes)
            .filter_map(|(class, last)| last.map(|last| (class, last)))
            .collect();
        Some(SizeClasses {
            from: *from,
            to: *to,
            newest,
        })
    }

    /// What the batches holding or following `offset` may be, for `offset`
    /// in the range the classes describe: each class whose newest batch
    /// ends at or after `offset` has a batch there, no other class has.
    fn bounds_from(&self, offset: i64) -> Option<SizeBounds> {
        if offset < self.from || offset >= self.to {
            return None;
        }
        let present = || {
            self.newest
                .iter()
                .filter(|(_, last)| *last >= offset)
                .map(|(class, _)| *class)
        };
        let (smallest, largest) = (present().min()?, present().max()?);
        Some(SizeBounds {
            smallest: if smallest == SMALLEST_CLASS {
                0
            } else {
                1 << smallest
            },
            largest: (1 << (largest + 1)) - 1,
        })
    }
}

/// What this gateway knows of a partition's batch sizes from its reads.
#[derive(Debug, Default)]
struct ReadSizes {
    seen: Option<BatchSizes>,
    classes: Option<SizeClasses>,
    /// The partition's `clean_end` as the last read saw it:
    /// a read below it goes to the compacted stream at once, not first to
    /// the log (trimmed there) to learn it.
    clean_end: i64,
}

/// Per-partition state of this gateway: append turns with the next offset
/// each expects, and the batch sizes reads have seen.
#[derive(Default)]
pub(crate) struct Appenders {
    partitions: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<i64>>>>>,
    read_sizes: std::sync::Mutex<HashMap<String, ReadSizes>>,
}

impl Appenders {
    /// The batch sizes seen on a partition; when its size classes describe
    /// `offset`, what the batches from `offset` on may be and the end of the
    /// range they describe; and its `clean_end` as reads last saw it (0:
    /// none seen).
    fn read_sizes(
        &self,
        meta_key: &str,
        offset: i64,
    ) -> (Option<BatchSizes>, Option<(SizeBounds, i64)>, i64) {
        let sizes = self.read_sizes.lock().expect("read sizes lock");
        sizes.get(meta_key).map_or((None, None, 0), |sizes| {
            let classes = sizes.classes.as_ref();
            let range = classes.and_then(|c| Some((c.bounds_from(offset)?, c.to)));
            (sizes.seen, range, sizes.clean_end)
        })
    }

    /// A read saw the partition's `clean_end`: the last seen is kept (it
    /// only grows in Redis; one a failover took back is learnt again).
    fn learn_clean_end(&self, meta_key: &str, clean_end: i64) {
        let mut sizes = self.read_sizes.lock().expect("read sizes lock");
        if let Some(known) = sizes.get_mut(meta_key) {
            known.clean_end = clean_end;
        } else if clean_end > 0 {
            sizes.insert(
                meta_key.to_owned(),
                ReadSizes {
                    clean_end,
                    ..ReadSizes::default()
                },
            );
        }
    }

    /// The largest batch reads have seen on a partition lately.
    fn largest_seen(&self, meta_key: &str) -> Option<usize> {
        let sizes = self.read_sizes.lock().expect("read sizes lock");
        sizes.get(meta_key)?.seen.map(|seen| seen.largest)
    }

    /// Records what one read of a partition saw: the sizes of the batches
    /// it read, and the size classes it found (the newest of two reads'
    /// classes wins).
    fn learn_read(&self, meta_key: &str, read: Option<BatchSizes>, classes: Option<SizeClasses>) {
        let mut sizes = self.read_sizes.lock().expect("read sizes lock");
        if !sizes.contains_key(meta_key) {
            sizes.insert(meta_key.to_owned(), ReadSizes::default());
        }
        let known = sizes.get_mut(meta_key).expect("just inserted");
        if let Some(read) = read {
            match &mut known.seen {
                Some(seen) => seen.learn(read),
                None => known.seen = Some(read),
            }
        }
        if let Some(classes) = classes
            && known.classes.as_ref().is_none_or(|old| old.to < classes.to)
        {
            known.classes = Some(classes);
        }
    }

    /// An entry was written at `offset` other than by an append (a
    /// transaction marker): a slot that expected it for its next batch
    /// expects the offset after it now, or that batch (staged, > 4 KiB)
    /// would be refused once and sent again. The slot is taken only for
    /// this, not across the marker's script: an append holds it while it
    /// waits for a durable connection.
    pub(crate) async fn written_at(&self, meta_key: &str, offset: i64) {
        let slot = self.slot(meta_key);
        let mut next = slot.lock().await;
        if *next == Some(offset) {
            *next = Some(offset + 1);
        }
    }

    /// Forgets the partitions whose meta keys are not in `live` (those of
    /// deleted topics). A slot an append holds or waits for stays; one
    /// forgotten while idle is made again, expecting nothing, by the next
    /// append (as after a restart).
    pub(crate) fn retain(&self, live: &std::collections::HashSet<&str>) {
        (self.partitions.lock().expect("appenders lock"))
            .retain(|key, slot| live.contains(key.as_str()) || Arc::strong_count(slot) > 1);
        (self.read_sizes.lock().expect("read sizes lock")).retain(|key, _| live.contains(key.as_str()));
    }

    /// The partition's append slot: held while this gateway appends to the
    /// partition, it keeps the next offset the last append left.
    fn slot(&self, meta_key: &str) -> Arc<tokio::sync::Mutex<Option<i64>>> {
        let mut partitions = self.partitions.lock().expect("appenders lock");
        if let Some(slot) = partitions.get(meta_key) {
            return slot.clone();
        }
        let slot = Arc::new(tokio::sync::Mutex::new(None));
        partitions.insert(meta_key.to_owned(), slot.clone());
        slot
    }
}

/// Where a batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendOutcome {
    pub base_offset: i64,
    pub log_start_offset: i64,
    /// The batch repeated one of its idempotent producer's last five:
    /// nothing was stored, `base_offset` is the original's.
    pub duplicate: bool,
}

/// A partition's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    /// First offset still in Redis (equal to the log start until tiering).
    pub local_start_offset: i64,
    pub high_watermark: i64,
    /// The first offset of the oldest transaction still open in the
    /// partition; the high watermark when none is. Fetches with
    /// read_committed stop here.
    pub last_stable_offset: i64,
    /// The offset of the partition's latest abort marker (-1: none): a
    /// fetch from above it needs no aborted transactions.
    pub last_abort: i64,
    /// The longest aborted transaction of the partition, in offsets (its
    /// abort marker's offset less its first offset; 0: none): aborted
    /// transactions whose data reaches an offset X have their markers
    /// below X + this.
    pub aborted_span: i64,
    /// Compacted topics: offsets below this are read from the compacted
    /// stream (`clean`), not the log (0: none yet).
    pub clean_end: i64,
}

impl PartitionOffsets {
    /// Offsets of a partition with no transactions.
    pub fn plain(log_start_offset: i64, local_start_offset: i64, high_watermark: i64) -> Self {
        Self {
            log_start_offset,
            local_start_offset,
            high_watermark,
            last_stable_offset: high_watermark,
            last_abort: -1,
            aborted_span: 0,
            clean_end: 0,
        }
    }
}

/// One partition to read.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest {
    pub offset: i64,
    /// Stop reading once this many bytes are gathered (a batch that
    /// crosses the limit may be included; the caller decides whether to
    /// send it), or when less than the partition's average batch is left
    /// and some were read.
    pub max_bytes: usize,
    /// The largest batch the partition may hold (its `max.message.bytes`):
    /// sizes the first read of a partition whose batches are unknown.
    pub max_batch_bytes: usize,
    /// What the read may hold at most (plus one batch): the fetch's
    /// remaining response budget; at least `max_bytes`.
    pub read_cap: usize,
}

/// What a read found.
#[derive(Debug, Clone, Default)]
pub struct ReadPartition {
    pub offsets: Option<PartitionOffsets>,
    /// Whole batches, base offsets patched, in offset order.
    pub batches: Vec<Bytes>,
}

impl Store {
    /// Appends one validated batch; wakes fetches waiting on the partition.
    ///
    /// Appends through this gateway to one partition take turns (a lock per
    /// partition) and predict the next offset from the last append, so the
    /// reserve step of `scripts/append.lua` normally agrees at once; after
    /// another gateway appended, it answers with the real next offset and
    /// the append is retried.
    ///
    /// With `acks_all`, the append is written on a connection of the durable
    /// pool and then waits there for the configured replicas (and fsync):
    /// [`StorageError::NotEnoughReplicasAfterAppend`] when they do not
    /// confirm in time. A duplicate of an earlier batch waits too: the script
    /// records the producer's activity, a write that `WAIT` then covers along
    /// with every write before it, the original batch included.
    pub async fn append(
        &self,
        topic: &Topic,
        partition: i32,
        batch: &Bytes,
        header: &BatchHeader,
        acks_all: bool,
    ) -> Result<AppendOutcome> {
        let wait = acks_all && self.durability.waits();
        let keys = self.partition_keys(topic, partition);
        if !wait && self.mode() == crate::Mode::Single {
            let via = Via::Wire(self.durable.wire(&keys.meta).await?);
            return self.append_once(topic, partition, batch, header, via).await;
        }
        // In cluster mode the write goes to the partition's master directly
        // (and a waiting one on a connection of its own, for its WAIT); a
        // master that lost the slot refuses it unwritten (MOVED): read the
        // slot map again and go to the new one.
        let mut attempt = 0;
        // A slot being migrated answers ASK for keys already moved; the
        // cluster connection follows it (ASKING) for an append that need
        // not WAIT on the connection that wrote.
        let mut asked = false;
        loop {
            let (via, durable) = if wait {
                let durable = self.durable.get(&keys.meta).await?;
                (Via::Conn(durable.conn()), Some(durable))
            } else if asked {
                (Via::Conn(self.conn()), None)
            } else {
                (Via::Wire(self.durable.wire(&keys.meta).await?), None)
            };
            match self
                .append_once(topic, partition, batch, header, via.clone())
                .await
            {
                Ok(outcome) => {
                    // Only an append that waits holds a durable connection.
                    let Some(durable) = durable else {
                        return Ok(outcome);
                    };
                    let waited = self.wait_durable_on(durable).await;
                    if let Err(StorageError::Unavailable(_)) = &waited {
                        self.refresh_slot_map().await;
                    }
                    return waited.map(|()| outcome);
                }
                Err(e) => {
                    drop(durable);
                    asked = matches!(&e, StorageError::Unavailable(m) if durable::is_ask(m));
                    if !self.retry_after(&e, &mut attempt).await? {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// After a write to a partition's master failed with `e`: whether to
    /// try again. A master that no longer (or not yet) serves the slot
    /// refused it unwritten (MOVED, ASK, …): up to [`MAX_MOVED_RETRIES`]
    /// times, after a pause a little longer each time, the slot map is read
    /// again and the write goes to the new master. A master that cannot be
    /// reached may be gone (a failover): the slot map is read again for the
    /// next request (the client's retry), which must not dial it again.
    pub(crate) async fn retry_after(&self, e: &StorageError, attempt: &mut u64) -> Result<bool> {
        match e {
            StorageError::Unavailable(message)
                if durable::is_moved(message) && *attempt < MAX_MOVED_RETRIES =>
            {
                *attempt += 1;
                tracing::debug!(error = %message, attempt = *attempt, "a write met a moved slot; reading the slot map");
                tokio::time::sleep(std::time::Duration::from_millis(50 * *attempt)).await;
                self.durable.refresh().await?;
                Ok(true)
            }
            StorageError::Unavailable(message) => {
                tracing::debug!(error = %message, "a write to a partition's master failed; reading the slot map");
                self.refresh_slot_map().await;
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Reads the slot map again; when that fails too, the next request
    /// tries again.
    pub(crate) async fn refresh_slot_map(&self) {
        if let Err(e) = self.durable.refresh().await {
            tracing::debug!(error = %e, "cannot read the slot map");
        }
    }

    /// [`Store::wait_durable`] on a connection of the durable pool, which a
    /// cancelled wait does not hand to the next write while Redis still
    /// blocks it ([`durable::Blocking`]).
    pub(crate) async fn wait_durable_on(&self, durable: durable::Durable) -> Result<()> {
        let conn = durable.conn();
        let limit = self.durability.timeout + std::time::Duration::from_secs(1);
        let blocking = durable::Blocking::new(durable, limit);
        let waited = self.wait_durable(conn).await;
        blocking.answered();
        waited
    }

    /// Waits until the writes of `conn` reached the configured replicas (and
    /// disk).
    pub(crate) async fn wait_durable(&self, mut conn: Conn) -> Result<()> {
        let wanted = self.durability.replicas;
        let timeout_ms = self.durability.timeout.as_millis().max(1) as u64;
        if self.durability.fsync {
            let waitaof: redis::RedisResult<(i64, i64)> = redis::cmd("WAITAOF")
                .arg(1)
                .arg(wanted)
                .arg(timeout_ms)
                .query_async(&mut conn)
                .await;
            match waitaof {
                Ok((local, acked)) if local >= 1 && acked >= i64::from(wanted) => return Ok(()),
                Ok((_, acked)) => return Err(StorageError::NotEnoughReplicasAfterAppend { acked, wanted }),
                Err(e) if e.to_string().to_ascii_lowercase().contains("unknown command") => {
                    tracing::warn!(
                        "redis has no WAITAOF (7.2+); storage.acks_all_fsync waits for replicas only"
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        if wanted == 0 {
            return Ok(());
        }
        let acked: i64 = redis::cmd("WAIT")
            .arg(wanted)
            .arg(timeout_ms)
            .query_async(&mut conn)
            .await?;
        if acked < i64::from(wanted) {
            return Err(StorageError::NotEnoughReplicasAfterAppend { acked, wanted });
        }
        Ok(())
    }

    async fn append_once(
        &self,
        topic: &Topic,
        partition: i32,
        batch: &Bytes,
        header: &BatchHeader,
        via: Via,
    ) -> Result<AppendOutcome> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let slot = self.appenders.slot(&keys.meta);
        let mut next = slot.lock().await;
        let appending = self.wake.appending(&keys.wake);
        for tried in 0..MAX_APPEND_ATTEMPTS {
            let expected = next.unwrap_or(-1);
            let inline = batch.len() <= INLINE_BATCH_BYTES || tried >= STAGED_ATTEMPTS;
            let attempt = match &via {
                Via::Conn(conn) => self
                    .try_append(conn.clone(), keys, expected, batch, header, inline)
                    .await
                    .map_err(|e| {
                        if is_noscript(&e) {
                            AppendFailure::NoScript
                        } else {
                            AppendFailure::Other(e.into())
                        }
                    }),
                Via::Wire(wire) => self
                    .try_append_wire(wire, keys, expected, batch, header, inline)
                    .await
                    .map_err(|e| match e {
                        StorageError::Unavailable(m) if m.starts_with("NOSCRIPT") => AppendFailure::NoScript,
                        e => AppendFailure::Other(e),
                    }),
            };
            let reply = match attempt {
                Ok(reply) => reply,
                Err(failure) => {
                    *next = None;
                    match failure {
                        AppendFailure::NoScript => {
                            self.load_append_script(&via).await?;
                            continue;
                        }
                        AppendFailure::Other(e) => return Err(e),
                    }
                }
            };
            match reply {
                AppendReply::Stored {
                    base_offset,
                    log_start_offset,
                } => {
                    let next_offset = base_offset + i64::from(header.record_count);
                    *next = Some(next_offset);
                    let transactional = header.is_transactional();
                    // A fetch tailing the partition here reads it back at
                    // once: keep it as a read from Redis would return it.
                    let tail = (!transactional
                        && batch.len() <= crate::tail::TAIL_BATCH_BYTES
                        && appending.keeps_tail())
                    .then(|| {
                        let mut copy = BytesMut::from(&batch[..]);
                        crate::batch::patch_header(&mut copy, base_offset, 0);
                        copy.freeze()
                    });
                    appending.stored(base_offset, next_offset, log_start_offset, transactional, tail);
                    return Ok(AppendOutcome {
                        base_offset,
                        log_start_offset,
                        duplicate: false,
                    });
                }
                AppendReply::Duplicate {
                    base_offset,
                    log_start_offset,
                } => {
                    return Ok(AppendOutcome {
                        base_offset,
                        log_start_offset,
                        duplicate: true,
                    });
                }
                AppendReply::Refused(reason) => {
                    appending.nothing_stored();
                    return Err(StorageError::Sequence(reason));
                }
                AppendReply::NoPartition => {
                    *next = None;
                    appending.nothing_stored();
                    return Err(StorageError::UnknownTopicOrPartition);
                }
                AppendReply::Moved { next_offset } => *next = Some(next_offset),
                AppendReply::Skipped => {
                    appending.nothing_stored();
                    return Err(StorageError::Data("the append script skipped a batch".to_owned()));
                }
            }
        }
        appending.nothing_stored();
        Err(StorageError::Conflict(format!(
            "partition {partition} of {} kept moving under {MAX_APPEND_ATTEMPTS} append attempts",
            topic.name
        )))
    }

    /// One attempt. With `inline` (a batch up to [`INLINE_BATCH_BYTES`], or
    /// a larger one that lost [`STAGED_ATTEMPTS`] races) the batch goes
    /// through the script in one call; otherwise it is staged around a
    /// plain XADD in MULTI/EXEC, so Redis does not hash its bytes in Lua.
    /// Both run on `conn`, so a `WAIT` there covers the write.
    async fn try_append(
        &self,
        mut conn: Conn,
        keys: &PartitionKeys,
        expected: i64,
        batch: &Bytes,
        header: &BatchHeader,
        inline: bool,
    ) -> redis::RedisResult<AppendReply> {
        let sha = self.scripts.append.get_hash();
        let count = header.record_count;
        let script_keys = append_keys(keys);
        let reserve = |mode: &str| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha)
                .arg(script_keys.len())
                .arg(&script_keys)
                .arg(mode)
                .arg(expected)
                .arg(count)
                .arg(header.max_timestamp)
                .arg(&keys.wake)
                .arg(TIME_INDEX_INTERVAL_BYTES)
                .arg(batch.len())
                .arg(header.producer_id)
                .arg(header.producer_epoch)
                .arg(header.base_sequence)
                .arg(transactional_arg(header))
                .arg(self.compact_producers_arg());
            cmd
        };
        let presence = self.wake.presence(&keys.wake).unwrap_or_default();
        if inline {
            return reserve("inline")
                .arg(&batch[..])
                .arg(&presence)
                .query_async(&mut conn)
                .await;
        }
        let last = expected.max(0) + i64::from(count) - 1;
        let mut reserve = reserve("reserve");
        reserve.arg("").arg(&presence);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .add_command(reserve)
            .cmd("XADD")
            .arg(&keys.staging)
            .arg("NOMKSTREAM")
            .arg(format!("{last}-{count}"))
            .arg("b")
            .arg(&batch[..])
            .arg("t")
            .arg(header.max_timestamp)
            .ignore()
            .cmd("EVALSHA")
            .arg(sha)
            .arg(script_keys.len())
            .arg(&script_keys)
            .arg("finish")
            .ignore();
        let (reply,): (AppendReply,) = pipe.query_async(&mut conn).await?;
        Ok(reply)
    }

    /// The same attempt on the data path's own connection: the batch goes
    /// from the request to the socket uncopied ([`Packed::bytes`]).
    async fn try_append_wire(
        &self,
        wire: &Wire,
        keys: &PartitionKeys,
        expected: i64,
        batch: &Bytes,
        header: &BatchHeader,
        inline: bool,
    ) -> Result<AppendReply> {
        let sha = self.scripts.append.get_hash();
        let count = header.record_count;
        let script_keys = append_keys(keys);
        let evalsha = |packed: &mut Packed, args: usize| {
            packed
                .command(3 + script_keys.len() + args)
                .arg("EVALSHA")
                .arg(sha)
                .int(script_keys.len() as i64);
            for key in script_keys {
                packed.arg(key);
            }
        };
        let reserve = |packed: &mut Packed, mode: &str| {
            evalsha(packed, 14);
            packed
                .arg(mode)
                .int(expected)
                .int(i64::from(count))
                .int(header.max_timestamp)
                .arg(&keys.wake)
                .int(TIME_INDEX_INTERVAL_BYTES as i64)
                .int(batch.len() as i64)
                .int(header.producer_id)
                .int(i64::from(header.producer_epoch))
                .int(i64::from(header.base_sequence))
                .arg(transactional_arg(header))
                .arg(self.compact_producers_arg());
        };
        let presence = self.wake.presence(&keys.wake).unwrap_or_default();
        let mut packed = Packed::default();
        if inline {
            reserve(&mut packed, "inline");
            packed.bytes(batch).arg(&presence);
            let mut replies = wire.request(packed).await?.into_iter();
            let reply = replies
                .next()
                .ok_or_else(|| StorageError::Data("no append reply".to_owned()))?;
            return parse_append_reply(reply.ok()?);
        }
        let last = expected.max(0) + i64::from(count) - 1;
        packed.command(1).arg("MULTI");
        reserve(&mut packed, "reserve");
        packed.arg("").arg(&presence);
        packed
            .command(8)
            .arg("XADD")
            .arg(&keys.staging)
            .arg("NOMKSTREAM")
            .arg(format!("{last}-{count}"))
            .arg("b")
            .bytes(batch)
            .arg("t")
            .int(header.max_timestamp);
        evalsha(&mut packed, 1);
        packed.arg("finish");
        packed.command(1).arg("EXEC");
        let mut replies = wire.request(packed).await?;
        let exec = replies
            .pop()
            .ok_or_else(|| StorageError::Data("no EXEC reply".to_owned()))?;
        // A command refused while queued (MOVED, a wrong argument) aborts
        // the transaction: its own error says why.
        for queued in replies {
            queued.ok()?;
        }
        match exec.ok()? {
            Reply::Array(results) => {
                let mut results = results.into_iter();
                let reserve = results
                    .next()
                    .ok_or_else(|| StorageError::Data("empty EXEC reply".to_owned()))?;
                let reply = parse_append_reply(reserve.ok()?)?;
                // The reservation stands once made: a refused XADD leaves
                // its offsets without their batch. Nothing known refuses
                // it (its id is above the log's last); were something to,
                // the producer must not be told the batch is stored.
                if let Some(Err(e)) = results.next().map(Reply::ok) {
                    tracing::error!(partition = %keys.meta, error = %e,
                        "a staged batch was refused after its offsets were reserved; the offsets stay empty");
                    return Err(e);
                }
                Ok(reply)
            }
            other => Err(StorageError::Data(format!(
                "append transaction replied {other:?}"
            ))),
        }
    }

    /// Loads the append script where it was missing: on the connection to
    /// the node that answered NOSCRIPT (a master promoted by a failover has
    /// an empty script cache, and the cluster connection may not list it
    /// among the masters yet).
    async fn load_append_script(&self, via: &Via) -> Result<()> {
        match via {
            Via::Conn(conn) => {
                self.scripts.append.load_async(&mut conn.clone()).await?;
            }
            Via::Wire(wire) => {
                let mut packed = Packed::default();
                packed
                    .command(3)
                    .arg("SCRIPT")
                    .arg("LOAD")
                    .arg(crate::APPEND_SCRIPT);
                for reply in wire.request(packed).await? {
                    reply.ok()?;
                }
            }
        }
        Ok(())
    }

    /// One round of a partition read: the entries of `XRANGE` and the meta
    /// fields `read_meta_query` asks for, on the data path's connection when
    /// there is one (the batches are then regions of its read buffer,
    /// patched in place, not copies).
    /// `expect`: about how many bytes the entries take (0: unknown).
    async fn read_round(
        &self,
        keys: &PartitionKeys,
        pipe: &redis::Pipeline,
        expect: usize,
    ) -> Result<(Vec<Entry>, Value)> {
        let (entries, meta): (Value, Value) = match self.on_wire(keys, pipe, expect).await? {
            OnWire::Replies(replies) => {
                let mut replies = replies.into_iter();
                let (Some(entries), Some(meta)) = (replies.next(), replies.next()) else {
                    return Err(StorageError::Data("a read got too few replies".to_owned()));
                };
                return Ok((wire_entries(entries)?, meta.into_value()));
            }
            OnWire::Moved | OnWire::Unplaced => self.read_following(pipe).await?,
        };
        Ok((stream_entries(entries)?, meta))
    }

    /// A read of one partition's keys (`pipe`) through the cluster
    /// connection, which follows a moved slot. A slot being migrated
    /// answers ASK for the keys already moved, and redis-rs follows an ASK
    /// only for a pipeline's first command: then each command goes alone,
    /// to wherever its key is now, in the pipeline's order (the commands
    /// only read, and a pipeline is not atomic anyway).
    async fn read_following<T: redis::FromRedisValue>(&self, pipe: &redis::Pipeline) -> Result<T> {
        let error = match pipe.query_async::<T>(&mut self.conn()).await {
            Ok(replies) => return Ok(replies),
            Err(e) => StorageError::from(e),
        };
        // redis-rs may end its retries of a half-moved slot on an ASK or on
        // a MOVED, whichever its retry count leaves last: either way the
        // commands go one at a time.
        if !matches!(&error, StorageError::Unavailable(m) if durable::is_moved(m)) {
            return Err(error);
        }
        let mut replies = Vec::new();
        for cmd in pipe.cmd_iter() {
            replies.push(cmd.query_async::<Value>(&mut self.conn()).await?);
        }
        redis::from_redis_value(Value::Array(replies)).map_err(|e| StorageError::Data(e.to_string()))
    }

    /// The entries of one `XRANGE` of a partition's stream (`xrange`), on
    /// the data path's connection when there is one, as [`Store::read`]
    /// reads them. `expect`: about how many bytes they take (0: unknown).
    pub(crate) async fn read_entries(
        &self,
        keys: &PartitionKeys,
        xrange: redis::Cmd,
        expect: usize,
    ) -> Result<Vec<Entry>> {
        let mut pipe = redis::pipe();
        pipe.add_command(xrange);
        match self.on_wire(keys, &pipe, expect).await? {
            OnWire::Replies(replies) => match replies.into_iter().next() {
                Some(entries) => wire_entries(entries),
                None => Err(StorageError::Data("XRANGE got no reply".to_owned())),
            },
            OnWire::Moved | OnWire::Unplaced => {
                let (entries,): (Value,) = self.read_following(&pipe).await?;
                stream_entries(entries)
            }
        }
    }

    /// Runs `pipe` over one partition's keys on the data path's connection
    /// (its replies, every one a success); in cluster mode a failure reads
    /// the slot map again (the slot moved, or its master is gone), and a
    /// moved slot, or one whose master is not known, is left to the cluster
    /// connection, which follows the move.
    async fn on_wire(&self, keys: &PartitionKeys, pipe: &redis::Pipeline, expect: usize) -> Result<OnWire> {
        let Ok(wire) = self.durable.wire(&keys.meta).await else {
            return Ok(OnWire::Unplaced);
        };
        let mut packed = Packed::default();
        packed.pipeline(pipe).expect(expect);
        let e = match wire
            .request(packed)
            .await
            .and_then(|replies| replies.into_iter().map(Reply::ok).collect::<Result<Vec<_>>>())
        {
            Ok(replies) => return Ok(OnWire::Replies(replies)),
            Err(e) => e,
        };
        if self.mode() == crate::Mode::Single {
            return Err(e);
        }
        if let Err(refresh) = self.durable.refresh().await {
            tracing::debug!(error = %refresh, "cannot read the slot map");
        }
        match e {
            StorageError::Unavailable(e) if durable::is_moved(&e) => Ok(OnWire::Moved),
            e => Err(e),
        }
    }

    /// The partition's log start offset and high watermark.
    pub async fn offsets(&self, topic: &Topic, partition: i32) -> Result<PartitionOffsets> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let (meta,): (Value,) = offsets_query(redis::pipe(), keys)
            .query_async(&mut self.conn())
            .await?;
        parse_offsets(meta)?.ok_or(StorageError::UnknownTopicOrPartition)
    }

    /// About how many bytes the next `records` records of a partition
    /// take: at most that many batches (a batch holds at least one record)
    /// of the largest size this gateway's reads have seen there lately.
    /// `None` when its reads have seen no batch. An estimate, not a bound:
    /// a fetch uses it to read partitions that hold little together.
    pub fn bytes_estimate(&self, topic: &Topic, partition: i32, records: i64) -> Option<usize> {
        let keys = self.partition_keys(topic, partition);
        let largest = self.appenders.largest_seen(&keys.meta)?;
        Some(largest.saturating_mul(usize::try_from(records).ok()?))
    }

    /// Reads whole batches from `request.offset` on. Fails with
    /// [`StorageError::OffsetOutOfRange`] below the log start or past the
    /// high watermark; at the high watermark it returns no batches.
    pub async fn read(&self, topic: &Topic, partition: i32, request: &ReadRequest) -> Result<ReadPartition> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let mut out = ReadPartition::default();
        // A negative offset is below every log start: the first round's
        // check answers OFFSET_OUT_OF_RANGE (Redis refuses it as an id).
        let mut next = request.offset.max(0);
        let mut bytes = 0usize;
        // Compacted topics: offsets below `clean_end` (as the last round's
        // meta said, or the last read: -1 until the first round learns it)
        // are read from the compacted stream (§7a).
        let mut clean_end = -1i64;
        loop {
            // Within the range the partition's size classes describe (as
            // the last read found them), the read asks for as many entries
            // as the budget holds at the largest size present there, and
            // stops at the range's end; past it, sizes are unknown until
            // this round's classes say: as if max.message.bytes.
            let (seen, range, remembered) = self.appenders.read_sizes(&keys.meta, next);
            if clean_end < 0 {
                clean_end = remembered;
            }
            let (end, bounds) = match range {
                Some((bounds, to)) => ((to - 1).to_string(), bounds),
                None => ("+".to_owned(), SizeBounds::at_most(request.max_batch_bytes)),
            };
            let ranged = range.is_some();
            let count = entries_for(
                request.max_bytes.saturating_sub(bytes),
                request.read_cap.saturating_sub(bytes),
                seen,
                bounds,
                out.offsets.is_none(),
            );
            if count == 0 {
                return Ok(out);
            }
            let from_clean = next < clean_end;
            let asked_clean_end = clean_end;
            // XRANGE first, then meta: the high watermark returned is never
            // below an offset returned, and a compaction that moved
            // `clean_end` past `next` before the XRANGE shows in the meta.
            let mut pipe = redis::pipe();
            if from_clean {
                pipe.cmd("XRANGE")
                    .arg(&keys.clean)
                    .arg(next)
                    .arg(clean_end - 1)
                    .arg("COUNT")
                    .arg(count);
            } else {
                pipe.cmd("XRANGE")
                    .arg(&keys.log)
                    .arg(next)
                    .arg(&end)
                    .arg("COUNT")
                    .arg(count);
            }
            // At most about what the entries take, where the partition's
            // batch sizes are known: the connection reads them in place.
            // The largest batch seen lately, not the average: a reply
            // longer than expected is moved whole once more.
            let expect = seen.map_or(0, |sizes| {
                reply_bytes(count, sizes.largest)
                    .min(request.read_cap.saturating_add(request.max_batch_bytes))
            });
            let (entries, meta) = self
                .read_round(keys, &read_meta_query(pipe, keys), expect)
                .await?;
            let (offsets, classes) = parse_read_meta(meta)?;
            let offsets = offsets.ok_or(StorageError::UnknownTopicOrPartition)?;
            if out.offsets.is_none()
                && (request.offset < offsets.log_start_offset || request.offset > offsets.high_watermark)
            {
                return Err(StorageError::OffsetOutOfRange {
                    log_start: offsets.log_start_offset,
                    high_watermark: offsets.high_watermark,
                });
            }
            if out.offsets.is_none() && request.offset < offsets.local_start_offset {
                return Err(StorageError::NotLocal {
                    offset: request.offset,
                    offsets,
                });
            }
            let later_round = out.offsets.is_some();
            if offsets.clean_end != clean_end {
                self.appenders.learn_clean_end(&keys.meta, offsets.clean_end);
            }
            clean_end = offsets.clean_end;
            if !from_clean && next < clean_end {
                // The log below `clean_end` is compacted away (or being
                // trimmed): read the compacted stream instead.
                out.offsets = Some(offsets);
                continue;
            }
            if later_round
                && !from_clean
                && (next < offsets.local_start_offset
                    || entries
                        .first()
                        .is_some_and(|e| e.last_offset - i64::from(e.record_count) + 1 > next))
            {
                // Local retention trimmed the log from `next` on since the
                // last round (those records are archived now): this
                // round's batches would follow the last round's with a
                // gap, which consumers take for compaction and step over.
                // What was read stands; a fetch from `next` is served from
                // the archive.
                return Ok(out);
            }
            out.offsets = Some(offsets);
            let got = entries.len();
            let (mut read, mut largest) = (0, 0);
            for entry in entries {
                next = entry.last_offset + 1;
                read += entry.batch.len();
                largest = largest.max(entry.batch.len());
                out.batches.push(entry.batch);
            }
            bytes += read;
            if from_clean {
                // Fewer entries than asked: the compacted stream ends here
                // (its last records may have been compacted away), unless
                // a pass swapped in a new one meanwhile: that one is read
                // from `next` (what was below the old `clean_end` may now
                // all be above it, and the high watermark with it).
                if got < count {
                    if clean_end != asked_clean_end {
                        continue;
                    }
                    next = next.max(clean_end);
                }
                if next >= offsets.high_watermark || bytes >= request.max_bytes {
                    return Ok(out);
                }
                continue;
            }
            let seen = read.checked_div(got).map(|average| BatchSizes {
                average,
                largest,
                seen: got,
            });
            self.appenders.learn_read(&keys.meta, seen, classes);
            // A ranged read that ran out stopped at its range's end: the
            // log may go on, with this round's classes to size the rest.
            let ran_out = got < count && (!ranged || got == 0);
            if ran_out || next >= offsets.high_watermark || bytes >= request.max_bytes {
                return Ok(out);
            }
        }
    }

    /// The earliest offset whose record timestamp is ≥ `timestamp`, with
    /// that record's timestamp; `None` when no record is that late. Only
    /// what Redis holds (from the local start) is searched: archived
    /// segments are ketch-tiering's.
    pub async fn offset_for_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>> {
        let offsets = self.offsets(topic, partition).await?;
        let keys = self.partition_keys(topic, partition);
        // The last index entry whose running max is below the target: no
        // record before it, nor in its batch, can qualify.
        let below: Vec<(String, f64)> = redis::cmd("ZREVRANGEBYSCORE")
            .arg(&keys.times)
            .arg(format!("({timestamp}"))
            .arg("-inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut self.conn())
            .await?;
        let start = below
            .first()
            .and_then(|(offset, _)| offset.parse::<i64>().ok())
            .unwrap_or(0)
            .max(offsets.local_start_offset);
        self.scan_for(topic, partition, start, offsets, move |ts| (ts >= timestamp, ()))
            .await
            .map(|(found, _)| found)
    }

    /// The offset and timestamp of the record with the largest timestamp
    /// (the first such record), for ListOffsets `-3`, among what Redis holds.
    pub async fn max_timestamp(&self, topic: &Topic, partition: i32) -> Result<Option<(i64, i64)>> {
        let offsets = self.offsets(topic, partition).await?;
        let keys = self.partition_keys(topic, partition);
        let (max_ts, batch_offset): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
            .arg(&keys.meta)
            .arg("max_ts")
            .arg("max_ts_offset")
            .query_async(&mut self.conn())
            .await?;
        let (Some(max_ts), Some(batch_offset)) = (max_ts, batch_offset) else {
            return Ok(None);
        };
        if batch_offset >= offsets.local_start_offset {
            let (found, _) = self
                .scan_for(topic, partition, batch_offset, offsets, move |ts| {
                    (ts == max_ts, ())
                })
                .await?;
            if found.is_some() {
                return Ok(found);
            }
        }
        // The record with the largest timestamp was deleted, or compacted
        // away: find the largest of what is left, then its first record
        // (as Kafka's cleaner recomputes a segment's).
        let mut largest: Option<i64> = None;
        let (_, largest) = self
            .scan_for(topic, partition, offsets.local_start_offset, offsets, move |ts| {
                largest = Some(largest.map_or(ts, |l| l.max(ts)));
                (false, largest)
            })
            .await?;
        let Some(largest) = largest.flatten() else {
            return Ok(None);
        };
        self.scan_for(topic, partition, offsets.local_start_offset, offsets, move |ts| {
            (ts == largest, ())
        })
        .await
        .map(|(found, _)| found)
    }

    /// Scans records from `start` and returns the first whose timestamp
    /// satisfies `visit` (its first answer), with `visit`'s last other answer.
    /// Keys and values are skipped, not copied; compressed batches are
    /// decompressed as a stream on the blocking pool, so a scan through
    /// large compressed batches never stalls a runtime thread.
    async fn scan_for<T: Send + 'static>(
        &self,
        topic: &Topic,
        partition: i32,
        start: i64,
        offsets: PartitionOffsets,
        visit: impl FnMut(i64) -> (bool, T) + Send + 'static,
    ) -> Result<(Option<(i64, i64)>, Option<T>)> {
        let keys = self.partition_keys(topic, partition);
        let mut next = start;
        let mut scan = Scan {
            start,
            visit,
            last: None,
        };
        // Compacted topics: below `clean_end` the records are in the
        // compacted stream (as in `read`).
        let mut clean_end = offsets.clean_end;
        while next < offsets.high_watermark {
            let from_clean = next < clean_end;
            let (stream, end) = if from_clean {
                (&keys.clean, (clean_end - 1).to_string())
            } else {
                (&keys.log, "+".to_owned())
            };
            let (entries, now_clean_end): (Value, Option<i64>) = redis::pipe()
                .cmd("XRANGE")
                .arg(stream)
                .arg(next)
                .arg(end)
                .arg("COUNT")
                .arg(SCAN_READ_COUNT)
                .cmd("HGET")
                .arg(&keys.meta)
                .arg("clean_end")
                .query_async(&mut self.conn())
                .await?;
            let now_clean_end = now_clean_end.unwrap_or(0);
            if !from_clean && next < now_clean_end {
                clean_end = now_clean_end;
                continue;
            }
            let entries = stream_entries(entries)?;
            let Some(last) = entries.last() else {
                if from_clean {
                    next = clean_end;
                    continue;
                }
                break;
            };
            next = last.last_offset + 1;
            let compressed = entries
                .iter()
                .any(|e| batch::header(&e.batch).is_ok_and(|h| h.is_compressed()));
            let found;
            (found, scan) = if compressed {
                tokio::task::spawn_blocking(move || {
                    let found = scan.entries(&entries);
                    (found, scan)
                })
                .await
                .map_err(|e| StorageError::Data(format!("timestamp scan failed: {e}")))?
            } else {
                (scan.entries(&entries), scan)
            };
            if let Some(found) = found? {
                return Ok((Some(found), scan.last));
            }
        }
        Ok((None, scan.last))
    }

    /// Moves the log start offset to `offset` (`-1`: the high watermark) and
    /// drops the batches wholly below it. Returns the new low watermark.
    /// With acks=all waiting for replicas (or fsync), it returns once they
    /// have the change too, as Kafka answers once every replica's log start
    /// moved; [`StorageError::NotEnoughReplicasAfterAppend`] when they do
    /// not confirm in time (the deletion stands on the master).
    pub async fn delete_records(&self, topic: &Topic, partition: i32, offset: i64) -> Result<i64> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let since = self.wake.generation(&keys.wake);
        let mut invocation = self.scripts.delete_records.key(&keys.meta);
        invocation
            .key(&keys.log)
            .key(&keys.times)
            .key(&keys.clean)
            .arg(offset)
            .arg(&keys.wake);
        let moved =
            |reply: &Value| matches!(reply, Value::Array(items) if items.first() == Some(&Value::Int(0)));
        let (reply, confirmed) = self.invoke_unconfirmed(&keys.meta, &invocation, moved).await?;
        let reply: Vec<i64> =
            redis::from_redis_value(reply).map_err(|e| StorageError::Data(format!("delete_records: {e}")))?;
        match reply[..] {
            [0, low_watermark] => {
                // The script told every gateway; this one knows at once.
                self.wake.wrote(&keys.wake, since, None, Some(low_watermark));
                confirmed?;
                Ok(low_watermark)
            }
            [-1] => Err(StorageError::UnknownTopicOrPartition),
            [-2, high_watermark] => Err(StorageError::OffsetOutOfRange {
                log_start: 0,
                high_watermark,
            }),
            _ => Err(StorageError::Data(format!(
                "delete_records script replied {reply:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deleted_partitions_are_forgotten_unless_an_append_holds_them() {
        let appenders = Appenders::default();
        for key in ["live", "deleted", "busy"] {
            *appenders.slot(key).lock().await = Some(7);
            appenders.learn_read(key, None, None);
        }
        let held = appenders.slot("busy");
        let _turn = held.lock().await;
        appenders.retain(&["live"].into_iter().collect());
        let slots: Vec<String> = appenders.partitions.lock().unwrap().keys().cloned().collect();
        assert_eq!(slots.len(), 2, "{slots:?}");
        assert!(slots.contains(&"live".to_owned()) && slots.contains(&"busy".to_owned()));
        let sizes: Vec<String> = appenders.read_sizes.lock().unwrap().keys().cloned().collect();
        assert_eq!(sizes, ["live"]);
        // The live partition's slot keeps what it expects.
        assert_eq!(*appenders.slot("live").lock().await, Some(7));
    }

    #[test]
    fn the_last_stable_offset_is_never_below_the_log_start() {
        // (high watermark, log start, local start, txn_first, aborted last,
        // aborted span, clean end)
        let offsets = |txn_first: Option<i64>, log_start: i64| {
            offsets_of(&[Some(100), Some(log_start), None, txn_first, None, None, None])
                .unwrap()
                .last_stable_offset
        };
        assert_eq!(offsets(None, 0), 100);
        assert_eq!(offsets(Some(40), 0), 40, "an open transaction holds it");
        // DeleteRecords past the open transaction's first offset.
        assert_eq!(offsets(Some(40), 60), 60);
    }

    #[test]
    fn the_first_read_of_a_partition_assumes_the_largest_batches() {
        // Nothing seen yet: as if every batch were max.message.bytes, within
        // the bytes wanted and the fetch's budget.
        assert_eq!(
            entries_for(1 << 20, 1 << 20, None, SizeBounds::at_most(1 << 20), true),
            1
        );
        assert_eq!(
            entries_for(1 << 20, 8 << 20, None, SizeBounds::at_most(1 << 20), true),
            1
        );
        assert_eq!(
            entries_for(4 << 20, 8 << 20, None, SizeBounds::at_most(1 << 20), true),
            4
        );
        assert_eq!(entries_for(100, 100, None, SizeBounds::at_most(1 << 20), true), 1);
        assert_eq!(
            entries_for(64 << 20, 64 << 20, None, SizeBounds::at_most(1 << 10), true),
            FIRST_READ_COUNT
        );
    }

    fn sizes(average: usize, largest: usize, seen: usize) -> Option<BatchSizes> {
        Some(BatchSizes {
            average,
            largest,
            seen,
        })
    }

    #[test]
    fn reads_size_their_count_from_the_batches_seen() {
        // 1,000-byte batches: the size classes say at most 1,023 bytes.
        let steady = sizes(1_000, 1_000, 1_000);
        // Many batches fit: one more than the average suggests.
        assert_eq!(
            entries_for(100_000, 8 << 20, steady, SizeBounds::at_most(1 << 10), true),
            101
        );
        assert_eq!(
            entries_for(
                usize::MAX / 4,
                usize::MAX / 4,
                steady,
                SizeBounds::at_most(1 << 10),
                true
            ),
            MAX_READ_COUNT
        );
        // Past the range the classes describe: as many as the budget holds
        // were they all max.message.bytes.
        assert_eq!(
            entries_for(100_000, 8 << 20, steady, SizeBounds::at_most(1 << 20), true),
            8
        );
        // A few large ones: no more than fit, so none is read to be dropped.
        let large = sizes(999_875, 999_875, 1_000);
        assert_eq!(
            entries_for(1 << 20, 8 << 20, large, SizeBounds::at_most(1 << 20), true),
            1
        );
        assert_eq!(
            entries_for(3 << 20, 8 << 20, large, SizeBounds::at_most(1 << 20), true),
            3
        );
        // Less than one batch left: the first read takes one anyway, a
        // later one stops.
        assert_eq!(
            entries_for(48_701, 8 << 20, large, SizeBounds::at_most(1 << 20), true),
            1
        );
        assert_eq!(
            entries_for(48_701, 8 << 20, large, SizeBounds::at_most(1 << 20), false),
            0
        );
        // A large batch among small ones: as many as fit the budget were
        // they all that large.
        let mixed = sizes(100_000, 1 << 20, 1_000);
        assert_eq!(
            entries_for(1 << 20, 8 << 20, mixed, SizeBounds::at_most(1 << 20), true),
            8
        );
        assert_eq!(
            entries_for(1 << 20, 1 << 20, mixed, SizeBounds::at_most(1 << 20), true),
            1
        );
    }

    #[test]
    fn a_few_small_batches_do_not_let_a_read_ask_for_many_large_ones() {
        // One small batch seen (the partition's first read met a small
        // batch among large ones): the budget still counts every entry as
        // max.message.bytes, not the 18 KB seen.
        let one = sizes(18_655, 18_655, 1);
        assert_eq!(
            entries_for(1 << 20, 1 << 20, one, SizeBounds::at_most(1 << 20), false),
            1
        );
        assert_eq!(
            entries_for(1 << 20, 8 << 20, one, SizeBounds::at_most(1 << 20), false),
            1
        );
        // More seen: reads grow with them, within the budget.
        let some = sizes(18_655, 18_655, 4);
        assert_eq!(
            entries_for(1 << 20, 8 << 20, some, SizeBounds::at_most(1 << 20), false),
            4
        );
        let more = sizes(18_655, 18_655, 16);
        assert_eq!(
            entries_for(1 << 20, 8 << 20, more, SizeBounds::at_most(1 << 20), false),
            8
        );
        // Seen enough: the average sizes the read, the size classes bound it.
        let trusted = sizes(18_655, 18_655, TRUSTED_SAMPLES);
        assert_eq!(
            entries_for(1 << 20, 8 << 20, trusted, SizeBounds::at_most(1 << 15), false),
            57
        );
        assert_eq!(
            entries_for(1 << 20, 1 << 20, trusted, SizeBounds::at_most(1 << 15), false),
            32
        );
        assert_eq!(
            entries_for(1 << 20, 8 << 20, trusted, SizeBounds::at_most(1 << 20), false),
            8
        );
    }

    #[test]
    fn batches_grown_past_the_average_are_read_as_their_classes_say() {
        // Reads learnt 100-byte batches; the range read now holds only
        // batches of 512 KiB to 1 MiB: two fill the bytes wanted, not
        // 1 MiB / 100 (what the average alone would ask for).
        let small = sizes(100, 100, 10_000);
        let grown = SizeBounds {
            smallest: 1 << 19,
            largest: (1 << 20) - 1,
        };
        assert_eq!(entries_for(1 << 20, 8 << 20, small, grown, true), 2);
        assert_eq!(entries_for(1 << 20, 1 << 20, small, grown, true), 1);
        // Past what the classes describe: within the budget, were every
        // batch max.message.bytes.
        assert_eq!(
            entries_for(1 << 20, 8 << 20, small, SizeBounds::at_most(1 << 20), true),
            8
        );
    }

    #[test]
    fn the_size_class_fields_are_the_classes_in_order() {
        let expected: Vec<String> = (SMALLEST_CLASS..=LARGEST_CLASS)
            .map(|c| format!("sz{c}"))
            .collect();
        assert_eq!(SIZE_CLASS_FIELDS.to_vec(), expected);
    }

    #[test]
    fn size_classes_bound_the_batches_from_an_offset_on() {
        // Offsets 100..200: the newest batch of class 9 (512-1023 bytes)
        // ends at 180, of class 19 (512 KiB-1 MiB) at 149, of class 6 at 199.
        let mut fields = vec![Some(100), Some(200)];
        fields.extend((SMALLEST_CLASS..=LARGEST_CLASS).map(|class| match class {
            6 => Some(199),
            9 => Some(180),
            19 => Some(149),
            _ => None,
        }));
        let classes = SizeClasses::parse(&fields).expect("classes");
        let bounds = |smallest, largest| Some(SizeBounds { smallest, largest });
        assert_eq!(classes.bounds_from(100), bounds(0, (1 << 20) - 1));
        assert_eq!(classes.bounds_from(149), bounds(0, (1 << 20) - 1));
        assert_eq!(classes.bounds_from(150), bounds(0, (1 << 10) - 1));
        assert_eq!(classes.bounds_from(181), bounds(0, (1 << 7) - 1));
        assert_eq!(classes.bounds_from(199), bounds(0, (1 << 7) - 1));
        // Outside the range they describe, they say nothing.
        assert_eq!(classes.bounds_from(99), None);
        assert_eq!(classes.bounds_from(200), None);
        // Only large batches from 100 on (the producer switched to them).
        let mut fields = vec![Some(100), Some(200), None, None, None, Some(99)];
        fields.extend((SMALLEST_CLASS + 4..=LARGEST_CLASS).map(|class| (class == 19).then_some(199)));
        let grown = SizeClasses::parse(&fields).expect("classes");
        assert_eq!(grown.bounds_from(100), bounds(1 << 19, (1 << 20) - 1));
        // A partition no gateway keeping classes has appended to.
        let none = vec![None; 2 + CLASSES];
        assert_eq!(SizeClasses::parse(&none), None);
    }

    #[test]
    fn the_average_is_the_mean_until_enough_batches_are_seen() {
        let mut learned = BatchSizes {
            average: 18_655,
            largest: 18_655,
            seen: 1,
        };
        learned.learn(BatchSizes {
            average: 999_875,
            largest: 999_875,
            seen: 3,
        });
        assert_eq!(learned.average, (18_655 + 3 * 999_875) / 4);
        assert_eq!(learned.largest, 999_875);
        assert_eq!(learned.seen, 4);
        learned.seen = TRUSTED_SAMPLES;
        let before = learned.average;
        learned.learn(BatchSizes {
            average: 1_000,
            largest: 1_000,
            seen: 1_000,
        });
        assert_eq!(learned.average, (before * 3 + 1_000) / 4);
        assert_eq!(learned.largest, 999_875 - 999_875 / 8);
    }
}

/// A timestamp scan's state, moved to the blocking pool and back.
pub(crate) struct Scan<F, T> {
    pub(crate) start: i64,
    pub(crate) visit: F,
    pub(crate) last: Option<T>,
}

impl<F: FnMut(i64) -> (bool, T), T> Scan<F, T> {
    /// The first record of `entries` from `start` on that `visit` accepts.
    pub(crate) fn entries(&mut self, entries: &[Entry]) -> Result<Option<(i64, i64)>> {
        for entry in entries {
            let base = entry.last_offset - i64::from(entry.record_count) + 1;
            let header = batch::header(&entry.batch)?;
            let mut records = Records::of_batch(&entry.batch)?;
            while let Some(record) = records.next_meta()? {
                let offset = base + i64::from(record.offset_delta);
                if offset < self.start {
                    continue;
                }
                // A LogAppendTime batch's records all carry its max timestamp.
                let timestamp = if header.is_log_append_time() {
                    header.max_timestamp
                } else {
                    record.timestamp
                };
                let (found, other) = (self.visit)(timestamp);
                self.last = Some(other);
                if found {
                    return Ok(Some((offset, timestamp)));
                }
            }
        }
        Ok(None)
    }
}

/// What `scripts/append.lua` answered (reserve and inline modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AppendReply {
    /// The batch is (inline) or will be (reserve, inside the transaction) stored.
    Stored { base_offset: i64, log_start_offset: i64 },
    /// It repeats one of its producer's last five batches: nothing stored,
    /// `base_offset` is the original's.
    Duplicate { base_offset: i64, log_start_offset: i64 },
    /// The partition's `meta` is gone.
    NoPartition,
    /// The expected next offset was wrong; retry with this one.
    Moved { next_offset: i64 },
    /// The idempotent producer's epoch or sequence is refused.
    Refused(SequenceError),
    /// (Markers) nothing to end in the partition.
    Skipped,
}

/// What a pipeline on the data path's connection came to.
enum OnWire {
    Replies(Vec<Reply>),
    /// The slot moved: the cluster connection follows it.
    Moved,
    /// No master is known for the slot (the map could not be read): the
    /// cluster connection finds one.
    Unplaced,
}

/// How an append reaches Redis.
#[derive(Clone)]
enum Via {
    /// The data path's own connection.
    Wire(Wire),
    /// redis-rs: acks=all appends that `WAIT` on their connection, and a
    /// slot being migrated (the cluster connection follows ASK).
    Conn(Conn),
}

enum AppendFailure {
    /// Redis does not have the script (restart, failover, SCRIPT FLUSH).
    NoScript,
    Other(StorageError),
}

fn parse_append_reply(reply: Reply) -> Result<AppendReply> {
    redis::from_redis_value(reply.into_value()).map_err(|e| StorageError::Data(e.to_string()))
}

/// Stream entries from an XRANGE reply read by [`Wire`]: each batch is
/// its region of the read buffer, its base offset patched there.
fn wire_entries(reply: Reply) -> Result<Vec<Entry>> {
    let bad = |what: &str| StorageError::Data(format!("stream entry: {what}"));
    let Reply::Array(items) = reply else {
        return Err(bad("XRANGE reply is not an array"));
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Reply::Array(pair) = item else {
            return Err(bad("entry is not an array"));
        };
        let [Reply::Bulk(id), Reply::Array(fields)] =
            <[Reply; 2]>::try_from(pair).map_err(|_| bad("entry is not [id, fields]"))?
        else {
            return Err(bad("entry is not [id, fields]"));
        };
        let (last_offset, record_count) = parse_entry_id(&id).ok_or_else(|| bad("id"))?;
        let mut batch = None;
        let mut it = fields.into_iter();
        while let (Some(name), Some(value)) = (it.next(), it.next()) {
            if let (Reply::Bulk(name), Reply::Bulk(value)) = (name, value)
                && &name[..] == b"b"
            {
                batch = Some(value);
            }
        }
        let mut batch = batch.ok_or_else(|| bad("no b field"))?;
        if batch.len() < batch::HEADER_LEN {
            return Err(bad("batch shorter than its header"));
        }
        batch::patch_header(&mut batch, last_offset - i64::from(record_count) + 1, 0);
        entries.push(Entry {
            last_offset,
            record_count,
            batch: batch.freeze(),
        });
    }
    Ok(entries)
}

/// A stream entry id `<last_offset>-<record_count>`.
pub(crate) fn parse_entry_id(id: &[u8]) -> Option<(i64, i32)> {
    let (last, count) = std::str::from_utf8(id).ok()?.split_once('-')?;
    Some((last.parse().ok()?, count.parse().ok()?))
}

impl redis::FromRedisValue for AppendReply {
    fn from_redis_value(v: Value) -> std::result::Result<Self, redis::ParsingError> {
        let bad = |v: &Value| redis::ParsingError::from(format!("append script replied {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad(&v));
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            _ => Err(bad(&v)),
        };
        let tag = match items.first() {
            Some(Value::BulkString(tag)) => tag.as_slice(),
            _ => return Err(bad(&v)),
        };
        Ok(match tag {
            b"stored" => AppendReply::Stored {
                base_offset: int(1)?,
                log_start_offset: int(2)?,
            },
            b"duplicate" => AppendReply::Duplicate {
                base_offset: int(1)?,
                log_start_offset: int(2)?,
            },
            b"no_partition" => AppendReply::NoPartition,
            b"moved" => AppendReply::Moved { next_offset: int(1)? },
            b"out_of_order" => AppendReply::Refused(SequenceError::OutOfOrder),
            b"stale_epoch" => AppendReply::Refused(SequenceError::StaleEpoch),
            b"not_in_transaction" => AppendReply::Refused(SequenceError::NotInTransaction),
            b"skipped" => AppendReply::Skipped,
            _ => return Err(bad(&v)),
        })
    }
}

/// The append script's keys (see `scripts/append.lua`).
pub(crate) fn append_keys(keys: &PartitionKeys) -> [&String; 7] {
    [
        &keys.meta,
        &keys.times,
        &keys.log,
        &keys.staging,
        &keys.producers,
        &keys.txns,
        &keys.aborted,
    ]
}

/// The append script's transactional flag for a batch.
fn transactional_arg(header: &BatchHeader) -> &'static str {
    if header.is_transactional() { "1" } else { "0" }
}

/// Redis lost its script cache (restart, SCRIPT FLUSH); EXEC reports the
/// EVALSHA's error inside its reply.
fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || e.to_string().contains("NOSCRIPT")
}

/// About the bytes of an `XRANGE` reply of `entries` entries whose batches
/// are at most `largest` bytes.
pub(crate) fn reply_bytes(entries: usize, largest: usize) -> usize {
    entries.saturating_mul(largest.saturating_add(ENTRY_FRAMING_BYTES))
}

/// One stream entry: a batch, its base offset already patched.
pub(crate) struct Entry {
    pub(crate) last_offset: i64,
    pub(crate) record_count: i32,
    pub(crate) batch: Bytes,
}

/// Adds the read of a partition's offsets and size classes (parsed by
/// [`parse_read_meta`]).
fn read_meta_query(mut pipe: redis::Pipeline, keys: &PartitionKeys) -> redis::Pipeline {
    let cmd = pipe
        .cmd("HMGET")
        .arg(&keys.meta)
        .arg(&OFFSET_FIELDS[..])
        .arg("sized_from")
        .arg("sized_to");
    cmd.arg(&SIZE_CLASS_FIELDS[..]);
    pipe
}

/// The meta fields of the size classes, `sz6` to `sz30`, in class order
/// (written out: every read round asks for them).
const SIZE_CLASS_FIELDS: [&str; CLASSES] = [
    "sz6", "sz7", "sz8", "sz9", "sz10", "sz11", "sz12", "sz13", "sz14", "sz15", "sz16", "sz17", "sz18",
    "sz19", "sz20", "sz21", "sz22", "sz23", "sz24", "sz25", "sz26", "sz27", "sz28", "sz29", "sz30",
];

fn parse_read_meta(meta: Value) -> Result<(Option<PartitionOffsets>, Option<SizeClasses>)> {
    let fields: Vec<Option<i64>> =
        redis::from_redis_value(meta).map_err(|e| StorageError::Data(format!("partition meta: {e}")))?;
    if fields.len() != OFFSET_FIELDS.len() + 2 + CLASSES {
        return Err(StorageError::Data(format!(
            "partition meta: {} fields",
            fields.len()
        )));
    }
    let offsets = offsets_of(&fields[..OFFSET_FIELDS.len()]);
    Ok((offsets, SizeClasses::parse(&fields[OFFSET_FIELDS.len()..])))
}

/// Adds the read of a partition's offsets (parsed by [`parse_offsets`]).
fn offsets_query(mut pipe: redis::Pipeline, keys: &PartitionKeys) -> redis::Pipeline {
    pipe.cmd("HMGET").arg(&keys.meta).arg(&OFFSET_FIELDS[..]);
    pipe
}

/// The meta fields a partition's offsets are read from (see [`offsets_of`]).
const OFFSET_FIELDS: [&str; 7] = [
    "next_offset",
    "log_start",
    "local_start",
    "txn_first",
    "aborted_last",
    "aborted_span",
    "clean_end",
];

fn parse_offsets(meta: Value) -> Result<Option<PartitionOffsets>> {
    let fields: Vec<Option<i64>> =
        redis::from_redis_value(meta).map_err(|e| StorageError::Data(format!("partition meta: {e}")))?;
    Ok(offsets_of(&fields))
}

/// The offsets of [`OFFSET_FIELDS`].
fn offsets_of(fields: &[Option<i64>]) -> Option<PartitionOffsets> {
    match *fields {
        [
            Some(high_watermark),
            Some(log_start_offset),
            local_start,
            txn_first,
            aborted_last,
            aborted_span,
            clean_end,
        ] => Some(PartitionOffsets {
            log_start_offset,
            local_start_offset: local_start.unwrap_or(log_start_offset),
            high_watermark,
            // Never below the log start: DeleteRecords or retention may
            // have removed an open transaction's first batch (Kafka's
            // maybeIncrementFirstUnstableOffset clamps it likewise).
            last_stable_offset: txn_first
                .unwrap_or(high_watermark)
                .min(high_watermark)
                .max(log_start_offset),
            last_abort: aborted_last.unwrap_or(-1),
            aborted_span: aborted_span.unwrap_or(0),
            clean_end: clean_end.unwrap_or(0),
        }),
        _ => None,
    }
}

/// Parses an XRANGE reply, patching each batch's header in place.
pub(crate) fn stream_entries(reply: Value) -> Result<Vec<Entry>> {
    let bad = |what: &str| StorageError::Data(format!("stream entry: {what}"));
    let Value::Array(items) = reply else {
        return Err(bad("XRANGE reply is not an array"));
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut pair) = item else {
            return Err(bad("entry is not an array"));
        };
        if pair.len() != 2 {
            return Err(bad("entry is not [id, fields]"));
        }
        let fields = pair.pop().expect("two elements");
        let id = pair.pop().expect("two elements");
        let Value::BulkString(id) = id else {
            return Err(bad("id is not a string"));
        };
        let id = std::str::from_utf8(&id).map_err(|_| bad("id is not UTF-8"))?;
        let (last, count) = id.split_once('-').ok_or_else(|| bad("id has no '-'"))?;
        let last_offset: i64 = last.parse().map_err(|_| bad("id offset"))?;
        let record_count: i32 = count.parse().map_err(|_| bad("id count"))?;
        let Value::Array(fields) = fields else {
            return Err(bad("fields are not an array"));
        };
        let mut batch = None;
        let mut it = fields.into_iter();
        while let (Some(name), Some(value)) = (it.next(), it.next()) {
            if let (Value::BulkString(name), Value::BulkString(value)) = (name, value)
                && name == b"b"
            {
                batch = Some(value);
            }
        }
        let batch = batch.ok_or_else(|| bad("no b field"))?;
        if batch.len() < batch::HEADER_LEN {
            return Err(bad("batch shorter than its header"));
        }
        let mut batch = batch;
        batch::patch_header(&mut batch, last_offset - i64::from(record_count) + 1, 0);
        entries.push(Entry {
            last_offset,
            record_count,
            batch: Bytes::from(batch),
        });
    }
    Ok(entries)
}

//! Log compaction (`cleanup.policy=compact`): for each key only its latest
//! record remains, with its offset (docs/architecture.md §7a).
//!
//! A compacted partition's log has two parts: the compacted stream
//! (`ketch:{TAG}:clean`), holding offsets below the meta field `clean_end`,
//! and the log stream from there on. A pass reads the sealed segments from
//! `clean_end` up to the first it may not compact yet (the open segment, an
//! open transaction, `min.compaction.lag.ms`), notes the latest offset of
//! every key there, then writes a new compacted stream — the old one and
//! those segments, less every record a later one of its key supersedes,
//! tombstones past `delete.retention.ms`, aborted transactions' records and
//! records without a key — in bounded chunks under the partition's lease
//! (`compact_add.lua`). `compact_swap.lua` then puts it in place and moves
//! `clean_end` in one O(1) step, and the log below `clean_end` is trimmed in
//! bounded steps. Readers choose the stream by `clean_end` after their
//! XRANGE (`Store::read`), so every read sees one consistent log.
//!
//! Batches keep their base offset, producer fields and codec; a batch of
//! which only some records remain is re-encoded with those records (their
//! offsets and timestamps unchanged) and compressed again with its codec,
//! and stored under the id `<last offset>-<offset span>`, so a reader
//! patches its base offset as for any other batch. A control batch (a
//! transaction marker) is kept while its transaction has records left, and
//! then until it is older than `delete.retention.ms`, as a tombstone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use redis::Value;

use crate::batch::{self, Record, Records};
use crate::keys::PartitionKeys;
use crate::log::Entry;
use crate::segments::Segment;
use crate::topics::Topic;
use crate::{Result, StorageError, Store};

/// A topic's compaction settings.
#[derive(Debug, Clone, Copy)]
pub struct CompactPolicy {
    /// `min.cleanable.dirty.ratio`.
    pub min_dirty_ratio: f64,
    /// `min.compaction.lag.ms`.
    pub min_lag_ms: i64,
    /// `max.compaction.lag.ms`.
    pub max_lag_ms: i64,
    /// `delete.retention.ms`.
    pub delete_retention_ms: i64,
    /// Distinct keys one pass holds in memory at most: a pass stops at the
    /// first segment boundary past it, and the next goes on from there.
    pub max_keys: usize,
}

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactOutcome {
    /// Records read (the compacted stream and the segments compacted).
    pub records_read: u64,
    /// Records kept.
    pub records_kept: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Offsets below this are compacted now.
    pub clean_end: i64,
}

/// Bytes of log the trimming after a pass removes per Redis command at
/// most (as the segments' sizes tell), so no command takes long.
const TRIM_STEP_BYTES: i64 = 8 * 1024 * 1024;
/// Bytes of batches one XRANGE of a pass asks for, about.
const READ_CHUNK_BYTES: usize = 1024 * 1024;
/// Bytes of batches one `compact_add.lua` call carries, about.
const WRITE_CHUNK_BYTES: usize = 512 * 1024;

/// An aborted transaction: producer id, first offset, abort marker offset.
type Aborted = (i64, i64, i64);

/// The partition's state a pass starts from.
struct Start {
    log_start: i64,
    /// `clean_end` as read (`None`: never compacted).
    clean_end: Option<i64>,
    clean_bytes: i64,
    /// Where the log is trimmed to below `clean_end` (after a pass).
    log_trimmed: i64,
    /// First offset not to compact: the open segment's base, or the first
    /// offset of an open transaction, whichever is lower.
    stable_end: i64,
    /// The log's next offset.
    next: i64,
    /// When the oldest segment holding a tombstone the compacted stream
    /// still keeps was sealed: a pass is due once it expires, new data or
    /// not.
    tomb_sealed: Option<i64>,
}

/// What `compact_swap.lua` takes for the pass's `clean_end` to give the
/// pass up (no `clean_end` is ever this).
const ABANDON: &str = "abandon";

/// How long after [`Store::ready_for_archive`] no pass starts or swaps in
/// on the partition: the config turning remote storage on is written
/// meanwhile (milliseconds after), and a pass begun in between saw it off.
const NO_COMPACTION_AFTER_GUARD: std::time::Duration = std::time::Duration::from_secs(60);

impl Store {
    /// Readies a partition for remote storage being turned on
    /// (`archive_guard.lua`): `false` when it was ever compacted (refused);
    /// else any compaction pass on it, under way or left by one cut short,
    /// is given up, and none starts or swaps in for a minute (unless
    /// `check`: validate_only), so none trims the log the archiver reads.
    pub async fn ready_for_archive(&self, topic: &Topic, partition: i32, check: bool) -> Result<bool> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let compacted: i64 = self
            .scripts
            .archive_guard
            .key(&keys.meta)
            .key(&keys.compacting)
            .arg(if check { "check" } else { "stop" })
            .arg(NO_COMPACTION_AFTER_GUARD.as_millis() as u64)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(compacted == 0)
    }

    /// One compaction pass over a partition of a compacted topic, by the
    /// worker `worker` that holds its lease; `None` when there was nothing
    /// due (or another worker finished a pass first).
    pub async fn compact(
        &self,
        topic: &Topic,
        partition: i32,
        worker: &str,
        policy: &CompactPolicy,
    ) -> Result<Option<CompactOutcome>> {
        let keys = self.partition_keys(topic, partition).clone();
        let Some(start) = self.compact_start(&keys).await? else {
            return Ok(None);
        };
        let now = crate::now_ms();
        // Tombstones kept past their time are removed by a pass even when
        // nothing new was written.
        let tombstones_due = start
            .tomb_sealed
            .is_some_and(|sealed| sealed < now - policy.delete_retention_ms);
        let clean_end = start.clean_end.unwrap_or(start.log_start).max(start.log_start);
        // Nothing sealed (and decided) since the last pass, nothing left to
        // trim, no tombstone due: an idle compacted partition costs its
        // tick one HMGET, not a read of every segment record it has.
        if clean_end >= start.stable_end
            && start.log_trimmed.max(start.log_start) >= clean_end
            && !tombstones_due
        {
            return Ok(None);
        }
        // The segment records as read: parsed for the pass, and as they are
        // for the swap, which replaces each one it changes only if it is
        // still there (retention may remove some meanwhile; nothing else
        // changes a compacted topic's segments but its lease holder).
        let (members, segments) = self.segment_members(&keys.segments).await?;
        // A pass that stopped before trimming (a crash) left the log below
        // `clean_end` in place: readers skip it, this trims it.
        self.trim_log(
            &keys,
            &segments,
            start.log_trimmed.max(start.log_start),
            clean_end,
        )
        .await?;

        let dirty: Vec<&Segment> = segments
            .iter()
            // A segment DeleteRecords cut into counts from the log start.
            .filter(|s| s.last >= clean_end)
            .take_while(|s| {
                s.last < start.stable_end
                    && (policy.min_lag_ms == 0 || now - aged_from(s) >= policy.min_lag_ms)
            })
            .collect();
        let dirty_bytes: i64 = dirty.iter().map(|s| s.bytes).sum();
        let ratio = dirty_bytes as f64 / (start.clean_bytes + dirty_bytes).max(1) as f64;
        // max.compaction.lag.ms counts from the oldest first batch of the
        // dirty segments (Kafka's maxCompactionDelay; timestamps <= 0 do
        // not count); segments sealed by an older release know only their
        // newest record.
        let first_batch = dirty.iter().filter_map(|s| s.first_ts).filter(|t| *t > 0).min();
        let overdue = match first_batch {
            Some(first) => now - first > policy.max_lag_ms,
            None => dirty
                .first()
                .is_some_and(|first| now - aged_from(first) > policy.max_lag_ms),
        };
        // Above the ratio, as Kafka's cleaner (1.0: only when overdue).
        let due = !dirty.is_empty() && (ratio > policy.min_dirty_ratio || overdue);
        if !due && !tombstones_due {
            return Ok(None);
        }
        let aborted = self.aborted_since(&keys, start.log_start).await?;

        // The latest offset of every key in the segments compacted, up to
        // `max_keys` keys (at a segment boundary; at least one segment).
        let mut latest: HashMap<Bytes, i64> = HashMap::new();
        // Control batches (transaction markers) are read again (whether
        // they stay depends on what their transaction keeps): their offsets.
        let mut controls: Vec<i64> = Vec::new();
        let mut dirty_end = clean_end;
        let (mut dirty_records, mut dirty_read_bytes) = (0u64, 0u64);
        for (compacted, segment) in dirty.into_iter().enumerate() {
            if compacted > 0 && latest.len() >= policy.max_keys {
                break;
            }
            let mut from = segment.base.max(clean_end);
            while from <= segment.last {
                let density = segment_density(segment);
                let entries = self.read_stream(&keys.log, from, segment.last, density).await?;
                let Some(last) = entries.last() else { break };
                from = last.last_offset + 1;
                let aborted = aborted.clone();
                let noted;
                (latest, controls, noted) = blocking(move || {
                    let (mut latest, mut controls, mut noted) = (latest, controls, (0, 0));
                    for entry in &entries {
                        noted.0 += note_keys(entry, &aborted, &mut latest, &mut controls)?;
                        noted.1 += entry.batch.len() as u64;
                    }
                    Ok((latest, controls, noted))
                })
                .await?;
                dirty_records += noted.0;
                dirty_read_bytes += noted.1;
            }
            dirty_end = segment.last + 1;
        }
        // The offsets that stay in the segments compacted: batches without
        // one are not read again.
        let mut survivors: Vec<i64> = latest
            .values()
            .copied()
            .filter(|offset| (clean_end..dirty_end).contains(offset))
            .chain(controls)
            .collect();
        // The log's last batch stays (`keep`, `Tombstones::tail`) when the
        // pass reaches it, whatever it holds (keyless records, of a topic
        // written under `delete` before): it is read again too.
        if dirty_end == start.next && start.next > clean_end {
            survivors.push(start.next - 1);
        }
        survivors.sort_unstable();

        // The new compacted stream: what was compacted before, then the
        // segments just compacted, each batch less what is superseded.
        // This pass, told apart from any other of this worker's or
        // another's (`compact_add.lua`).
        let pass = format!("{:016x}", rand::random::<u64>());
        let mut writer = Writer::new(self, &keys, worker, &pass);
        let latest = Arc::new(latest);
        let mut outcome = CompactOutcome {
            clean_end: dirty_end,
            ..CompactOutcome::default()
        };
        // A tombstone or marker is kept delete.retention.ms from the pass
        // that first compacts its segment (this one, for the dirty
        // segments), so a reader that read what it deletes (or an aborted
        // transaction's records) before that pass still reads it after.
        let first_compacted = |s: &Segment| {
            if s.last >= clean_end {
                now
            } else {
                s.compacted_ms.unwrap_or(s.sealed_ms)
            }
        };
        let tombstones = Tombstones {
            segments: segments
                .iter()
                .map(|s| (s.base, s.last, first_compacted(s)))
                .collect(),
            until: now - policy.delete_retention_ms,
            tail: start.next - 1,
        };
        let tombstones = Arc::new(tombstones);
        let mut new_bytes: HashMap<i64, i64> = HashMap::new();
        // Each segment's largest timestamp over what it keeps, as Kafka's
        // cleaner computes a cleaned segment's (time retention and the
        // compaction lags count from it).
        let mut new_max_ts: HashMap<i64, i64> = HashMap::new();
        let mut tomb_sealed: Option<i64> = None;
        // What a pass cut short left, removed only while this worker holds
        // the lease: a worker that lost it must not remove the pass its
        // new holder is writing (it would swap in what is left of it).
        let started: i64 = self
            .scripts
            .compact_add
            .key(&keys.lease)
            .key(&keys.compacting)
            .key(&keys.meta)
            .arg(worker)
            .arg(&pass)
            .invoke_async(&mut self.conn())
            .await?;
        if started != 1 {
            return Ok(None);
        }
        outcome.records_read = dirty_records;
        outcome.bytes_before = dirty_read_bytes;
        let mut next_survivor = 0;
        // Producers with transactional data kept since their last marker:
        // a marker whose transaction has none left goes once it is older
        // than delete.retention.ms, as a tombstone does.
        let mut with_data: HashSet<i64> = HashSet::new();
        // The index members of aborted transactions whose markers go.
        let mut forgotten: Vec<String> = Vec::new();
        for dirty in [false, true] {
            let (stream, to) = if dirty {
                (&keys.log, dirty_end - 1)
            } else {
                (&keys.clean, clean_end - 1)
            };
            let mut from = if dirty { clean_end } else { start.log_start };
            loop {
                if dirty {
                    // Skip to the next batch holding a record that stays.
                    match survivors.get(next_survivor) {
                        Some(offset) => from = from.max(*offset),
                        None => break,
                    }
                }
                if from > to {
                    break;
                }
                let density = if dirty {
                    tombstones
                        .segment_of(from)
                        .and_then(|(base, _)| segments.iter().find(|s| s.base == base))
                        .map_or(1.0, segment_density)
                } else {
                    start.clean_bytes as f64 / (clean_end - start.log_start).max(1) as f64
                };
                let entries = self.read_stream(stream, from, to, density).await?;
                let Some(last) = entries.last() else { break };
                from = last.last_offset + 1;
                while survivors.get(next_survivor).is_some_and(|offset| *offset < from) {
                    next_survivor += 1;
                }
                let (latest, of_pass, horizon) = (latest.clone(), aborted.clone(), tombstones.clone());
                let kept = blocking(move || {
                    entries
                        .iter()
                        .map(|entry| keep(entry, &latest, &of_pass, &horizon))
                        .collect::<Result<Vec<_>>>()
                })
                .await?;
                for mut kept in kept {
                    if !dirty {
                        outcome.records_read += kept.read;
                        outcome.bytes_before += kept.bytes_before;
                    }
                    if kept.control && !with_data.remove(&kept.producer) && kept.last < tombstones.tail {
                        if tombstones.expired(kept.base) {
                            kept.batch = None;
                            forgotten.extend(
                                aborted
                                    .iter()
                                    .filter(|(producer, _, marker)| {
                                        *producer == kept.producer && *marker == kept.base
                                    })
                                    .map(|(producer, first, _)| format!("{producer}:{first}")),
                            );
                        } else {
                            kept.tomb_sealed = tombstones.segment_of(kept.base).map(|(_, sealed)| sealed);
                        }
                    } else if kept.transactional && !kept.control && kept.batch.is_some() {
                        with_data.insert(kept.producer);
                    }
                    if let Some(sealed) = kept.tomb_sealed {
                        tomb_sealed = Some(tomb_sealed.map_or(sealed, |t: i64| t.min(sealed)));
                    }
                    let Some((id, batch)) = kept.batch else { continue };
                    outcome.records_kept += kept.kept;
                    outcome.bytes_after += batch.len() as u64;
                    let segment = tombstones
                        .segment_of(kept.base)
                        .map_or(kept.base, |(base, _)| base);
                    *new_bytes.entry(segment).or_default() += batch.len() as i64;
                    let max_ts = batch::header(&batch).map_or(-1, |h| h.max_timestamp);
                    let segment_max = new_max_ts.entry(segment).or_insert(-1);
                    *segment_max = (*segment_max).max(max_ts);
                    if !writer.push(id, batch).await? {
                        return Ok(None);
                    }
                }
            }
        }
        if !writer.flush().await? {
            return Ok(None);
        }

        // Segments below `dirty_end` get their compacted sizes (retention
        // by bytes counts them); `log_bytes` keeps what the log held, for
        // the trimming steps.
        let mut changes: Vec<String> = Vec::new();
        for (member, segment) in members.iter().zip(&segments) {
            if segment.base >= dirty_end || segment.last < start.log_start {
                continue;
            }
            let Ok(mut json) = serde_json::from_str::<serde_json::Value>(member) else {
                continue;
            };
            if segment.base < start.log_start {
                // Cut into by DeleteRecords: its sizes stay, but its
                // tombstones are kept from this pass too.
                if json.get("compacted_ms").is_none() {
                    json["compacted_ms"] = serde_json::Value::from(now);
                    changes.push(member.clone());
                    changes.push(json.to_string());
                }
                continue;
            }
            let log_bytes = json
                .get("log_bytes")
                .or_else(|| json.get("bytes"))
                .cloned()
                .unwrap_or(serde_json::Value::from(0));
            json["log_bytes"] = log_bytes;
            if json.get("compacted_ms").is_none() {
                json["compacted_ms"] = serde_json::Value::from(now);
            }
            json["bytes"] = serde_json::Value::from(new_bytes.get(&segment.base).copied().unwrap_or(0));
            // One left empty has none (-1): retention then ages it from
            // when it was sealed, as Kafka ages an empty cleaned segment
            // from its file's last write.
            json["max_ts"] = serde_json::Value::from(new_max_ts.get(&segment.base).copied().unwrap_or(-1));
            changes.push(member.clone());
            changes.push(json.to_string());
        }
        // Remote storage turned on while the pass ran: AlterConfigs gives
        // up the pass under way (`ready_for_archive`), but this one may
        // have begun after that, before the config was written. The
        // archiver reads the log the swap would trim, so the pass is given
        // up and the log kept.
        let remote = self.topic_fresh(&topic.name).await?.is_none_or(|now| {
            now.id != topic.id
                || now
                    .configs
                    .get("remote.storage.enable")
                    .is_some_and(|v| v == "true")
        });
        let swapped: i64 = self
            .scripts
            .compact_swap
            .key(&keys.meta)
            .key(&keys.lease)
            .key(&keys.compacting)
            .key(&keys.clean)
            .key(&keys.segments)
            .key(&keys.aborted)
            .arg(format!("{worker} {pass}"))
            .arg(if remote {
                ABANDON.to_owned()
            } else {
                start.clean_end.map_or(String::new(), |c| c.to_string())
            })
            .arg(dirty_end)
            .arg(outcome.bytes_after)
            .arg(tomb_sealed.map_or(String::new(), |t| t.to_string()))
            .arg(forgotten.len())
            .arg(&forgotten[..])
            .arg(&changes[..])
            .invoke_async(&mut self.conn())
            .await?;
        if swapped != 1 {
            return Ok(None);
        }
        // The segments as read hold the log's sizes of those just compacted.
        self.trim_log(&keys, &segments, clean_end, dirty_end).await?;
        Ok(Some(outcome))
    }

    async fn compact_start(&self, keys: &PartitionKeys) -> Result<Option<Start>> {
        let fields: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(&keys.meta)
            .arg(&[
                "next_offset",
                "log_start",
                "seg_base",
                "clean_end",
                "clean_bytes",
                "log_trimmed",
                "txn_first",
                "tomb_sealed",
                "no_compaction_until",
            ])
            .query_async(&mut self.conn())
            .await?;
        let [
            Some(next),
            Some(log_start),
            seg_base,
            clean_end,
            clean_bytes,
            log_trimmed,
            txn_first,
            tomb_sealed,
            no_compaction_until,
        ] = fields[..]
        else {
            return Ok(None);
        };
        // Remote storage is being turned on (`archive_guard.lua`): no pass
        // starts (compact_add.lua refuses it anyway, on Redis's clock).
        if no_compaction_until.is_some_and(|until| crate::now_ms() < until) {
            return Ok(None);
        }
        Ok(Some(Start {
            log_start,
            clean_end,
            clean_bytes: clean_bytes.unwrap_or(0),
            log_trimmed: log_trimmed.unwrap_or(0),
            stable_end: seg_base.unwrap_or(next).min(txn_first.unwrap_or(next)),
            next,
            tomb_sealed,
        }))
    }

    /// The partition's aborted transactions from `from` on.
    async fn aborted_since(&self, keys: &PartitionKeys, from: i64) -> Result<Arc<Vec<Aborted>>> {
        let members: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(&keys.aborted)
            .arg(from)
            .arg("+inf")
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await?;
        let aborted = members
            .into_iter()
            .filter_map(|(member, marker)| {
                let (producer, first) = member.split_once(':')?;
                Some((producer.parse().ok()?, first.parse().ok()?, marker as i64))
            })
            .collect();
        Ok(Arc::new(aborted))
    }

    /// Entries of `stream` from the one holding `from` on, whose last
    /// offsets are at most `to`: those of the next [`READ_CHUNK_BYTES`] or
    /// so at `density` bytes per offset (at least one entry), so no XRANGE
    /// builds a large reply whatever the batch sizes.
    async fn read_stream(&self, stream: &str, from: i64, to: i64, density: f64) -> Result<Vec<Entry>> {
        let span = (READ_CHUNK_BYTES as f64 / density.max(1.0)) as i64;
        let end = to.min(from.saturating_add(span.max(1) - 1));
        let xrange = |end: i64, count: usize| {
            let mut cmd = redis::cmd("XRANGE");
            cmd.arg(stream).arg(from).arg(end).arg("COUNT").arg(count);
            cmd
        };
        let reply: Value = xrange(end, 1024).query_async(&mut self.conn()).await?;
        let mut entries = crate::log::stream_entries(reply)?;
        if entries.is_empty() && end < to {
            // One batch spans past the window: read it alone.
            let reply: Value = xrange(to, 1).query_async(&mut self.conn()).await?;
            entries = crate::log::stream_entries(reply)?;
        }
        Ok(entries)
    }

    /// Trims the log below `to` (where the compacted stream takes over),
    /// from `from`, in steps of about [`TRIM_STEP_BYTES`] as the segments'
    /// sizes in the log tell, then records how far it is trimmed.
    async fn trim_log(&self, keys: &PartitionKeys, segments: &[Segment], from: i64, to: i64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let mut points = Vec::new();
        for s in segments.iter().filter(|s| s.last >= from && s.base < to) {
            let span = s.last - s.base + 1;
            let bytes = s.log_bytes.unwrap_or(s.bytes).max(1);
            let stride = (span * TRIM_STEP_BYTES / bytes).clamp(1, span);
            let mut point = s.base.max(from) + stride;
            while point <= s.last.min(to - 1) {
                points.push(point);
                point += stride;
            }
        }
        points.push(to);
        for point in points {
            // Entry ids are <last offset>-<span>: MINID removes the batches
            // whose last offset is below `point`.
            redis::cmd("XTRIM")
                .arg(&keys.log)
                .arg("MINID")
                .arg(point)
                .query_async::<()>(&mut self.conn())
                .await?;
        }
        // Not on a partition whose topic was deleted meanwhile.
        let _: i64 = self
            .scripts
            .hset_existing
            .key(&keys.meta)
            .arg("log_trimmed")
            .arg(to)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }
}

/// Bytes per offset of a segment in the log.
fn segment_density(segment: &Segment) -> f64 {
    segment.log_bytes.unwrap_or(segment.bytes) as f64 / (segment.last - segment.base + 1).max(1) as f64
}

/// Runs CPU work (decompressing, re-encoding) off the runtime threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StorageError::Data(format!("compaction task failed: {e}")))?
}

/// Whether a batch holds an aborted transaction's records.
fn is_aborted(header: &batch::BatchHeader, base: i64, aborted: &[Aborted]) -> bool {
    header.is_transactional()
        && !header.is_control()
        && aborted.iter().any(|(producer, first, marker)| {
            *producer == header.producer_id && *first <= base && base < *marker
        })
}

fn base_of(entry: &Entry) -> i64 {
    entry.last_offset - i64::from(entry.record_count) + 1
}

/// Notes the offset of every keyed record of `entry` in `latest`, and the
/// base offset of a control batch in `controls`; returns its record count.
fn note_keys(
    entry: &Entry,
    aborted: &[Aborted],
    latest: &mut HashMap<Bytes, i64>,
    controls: &mut Vec<i64>,
) -> Result<u64> {
    let header = batch::header(&entry.batch).map_err(StorageError::Corrupt)?;
    let base = base_of(entry);
    let count = u64::try_from(header.record_count).unwrap_or(0);
    if header.is_control() {
        controls.push(base);
        return Ok(count);
    }
    if is_aborted(&header, base, aborted) {
        return Ok(count);
    }
    let mut records = Records::of_batch(&entry.batch).map_err(StorageError::Corrupt)?;
    while let Some(record) = records.next_record().map_err(StorageError::Corrupt)? {
        if let Some(key) = record.key {
            latest.insert(key, base + i64::from(record.offset_delta));
        }
    }
    Ok(count)
}

/// When tombstones may go: the segments (base, last, sealed at), and the
/// time before which a segment's tombstones have been kept long enough.
/// The last batch of the log never goes (`tail`: its last offset): the
/// end of the log stays, as Kafka's active segment does, so a consumer
/// positioned there finds a batch that moves it to the end (a Kafka
/// Streams restore reads up to the end offset).
struct Tombstones {
    segments: Vec<(i64, i64, i64)>,
    until: i64,
    tail: i64,
}

impl Tombstones {
    /// The segment holding `offset`: its base and when it was first
    /// compacted (its seal, for one an older release compacted).
    fn segment_of(&self, offset: i64) -> Option<(i64, i64)> {
        let i = self.segments.partition_point(|(_, last, _)| *last < offset);
        self.segments
            .get(i)
            .filter(|(base, ..)| *base <= offset)
            .map(|(base, _, sealed)| (*base, *sealed))
    }

    /// Whether a tombstone (or transaction marker) at `offset` has been
    /// kept `delete.retention.ms` since its segment was first compacted.
    fn expired(&self, offset: i64) -> bool {
        self.segment_of(offset)
            .is_some_and(|(_, sealed)| sealed < self.until)
    }
}

/// One batch after compaction.
struct Kept {
    base: i64,
    last: i64,
    /// Its producer, and whether it is a transaction's data or marker.
    producer: i64,
    transactional: bool,
    control: bool,
    /// When the segment of its oldest kept tombstone was sealed.
    tomb_sealed: Option<i64>,
    read: u64,
    kept: u64,
    bytes_before: u64,
    /// Its stream id and bytes, unless nothing of it remains.
    batch: Option<(String, Bytes)>,
}

/// What remains of `entry`: the records no later one of their key
/// supersedes, tombstones until they expire, no aborted transaction's
/// records and no records without a key; control batches whole. The
/// log's last batch keeps its last offset, as Kafka's cleaner keeps the
/// last batch of a round (`RETAIN_EMPTY`): there, records without a key
/// and tombstones stay, but a value a later record of its key supersedes
/// goes as anywhere else (kept, it outlived its key's tombstone and came
/// back once that expired).
fn keep(
    entry: &Entry,
    latest: &HashMap<Bytes, i64>,
    aborted: &[Aborted],
    tombstones: &Tombstones,
) -> Result<Kept> {
    let corrupt = StorageError::Corrupt;
    let header = batch::header(&entry.batch).map_err(corrupt)?;
    let base = base_of(entry);
    let mut out = Kept {
        base,
        last: entry.last_offset,
        producer: header.producer_id,
        transactional: header.is_transactional(),
        control: header.is_control(),
        tomb_sealed: None,
        read: u64::try_from(header.record_count).unwrap_or(0),
        kept: 0,
        bytes_before: entry.batch.len() as u64,
        batch: None,
    };
    let id = |last: i64| format!("{last}-{}", last - base + 1);
    let tail = entry.last_offset >= tombstones.tail;
    if header.is_control() {
        out.kept = out.read;
        out.batch = Some((id(entry.last_offset), entry.batch.clone()));
        return Ok(out);
    }
    if is_aborted(&header, base, aborted) {
        return Ok(out);
    }
    let mut records = Records::of_batch(&entry.batch).map_err(corrupt)?;
    let mut kept: Vec<Record> = Vec::new();
    let mut all = true;
    while let Some(record) = records.next_record().map_err(corrupt)? {
        let offset = base + i64::from(record.offset_delta);
        // In the log's last batch its last record always stays: without a
        // key, a tombstone, or its key's latest.
        let stays = match &record.key {
            None => tail,
            Some(key) => {
                latest.get(key).is_none_or(|newest| *newest <= offset)
                    && (record.value.is_some() || tail || !tombstones.expired(offset))
            }
        };
        if stays {
            if record.value.is_none() {
                let sealed = tombstones.segment_of(offset).map(|(_, sealed)| sealed);
                out.tomb_sealed = out.tomb_sealed.or(sealed);
            }
            kept.push(record);
        } else {
            all = false;
        }
    }
    out.kept = kept.len() as u64;
    if kept.is_empty() {
        return Ok(out);
    }
    // A batch partly kept keeps its last offset, as Kafka's cleaner keeps it
    // (`batch::rebuild`), and so its stream id.
    let batch = if all {
        entry.batch.clone()
    } else {
        batch::rebuild(&entry.batch, &kept).map_err(corrupt)?
    };
    out.batch = Some((id(entry.last_offset), batch));
    Ok(out)
}

/// Writes the new compacted stream in chunks, under the lease.
struct Writer<'a> {
    store: &'a Store,
    keys: &'a PartitionKeys,
    worker: &'a str,
    pass: &'a str,
    chunk: Vec<(String, Bytes)>,
    bytes: usize,
}

impl<'a> Writer<'a> {
    fn new(store: &'a Store, keys: &'a PartitionKeys, worker: &'a str, pass: &'a str) -> Self {
        Self {
            store,
            keys,
            worker,
            pass,
            chunk: Vec::new(),
            bytes: 0,
        }
    }

    /// Adds a batch; false when the lease is lost or the pass is no longer
    /// the partition's current one (the pass stops).
    async fn push(&mut self, id: String, batch: Bytes) -> Result<bool> {
        self.bytes += batch.len();
        self.chunk.push((id, batch));
        if self.bytes >= WRITE_CHUNK_BYTES || self.chunk.len() >= 512 {
            return self.flush().await;
        }
        Ok(true)
    }

    async fn flush(&mut self) -> Result<bool> {
        if self.chunk.is_empty() {
            return Ok(true);
        }
        let mut call = self.store.scripts.compact_add.key(&self.keys.lease);
        call.key(&self.keys.compacting)
            .key(&self.keys.meta)
            .arg(self.worker)
            .arg(self.pass);
        for (id, batch) in self.chunk.drain(..) {
            call.arg(id).arg(&batch[..]);
        }
        self.bytes = 0;
        let added: i64 = call.invoke_async(&mut self.store.conn()).await?;
        Ok(added == 1)
    }
}

/// When a segment's age counts from (`min.compaction.lag.ms`,
/// `max.compaction.lag.ms`): its largest timestamp, or for one whose
/// records carry none (-1) when it was sealed (as `scripts/seal.lua` ages
/// it for retention; Kafka counts from the file's last write).
fn aged_from(segment: &Segment) -> i64 {
    if segment.max_ts >= 0 {
        segment.max_ts
    } else {
        segment.sealed_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;

    /// A stored batch at `base` of `records` (key, value), with `codec`'s
    /// attribute bits (the body as the builder wrote it: `rebuild`
    /// compresses what it writes with the codec the attributes name).
    fn stored(base: i64, records: &[(&str, Option<&str>)], codec: i16) -> Entry {
        let mut builder = BatchBuilder::new(base);
        for (i, (key, value)) in records.iter().enumerate() {
            let header = [(&b"h"[..], Some(&b"v"[..]))];
            builder.push(
                1_000 + i as i64,
                Some(key.as_bytes()),
                value.map(str::as_bytes),
                header.into_iter(),
            );
        }
        let plain = builder.finish();
        let mut batch = plain.to_vec();
        if codec != 0 {
            // Compressed by `rebuild` itself, keeping every record.
            let mut all = Vec::new();
            let mut records = Records::of_batch(&plain).unwrap();
            while let Some(r) = records.next_record().unwrap() {
                all.push(r);
            }
            batch[21..23].copy_from_slice(&codec.to_be_bytes());
            batch = batch::rebuild(&batch, &all).unwrap().to_vec();
        }
        Entry {
            last_offset: base + records.len() as i64 - 1,
            record_count: records.len() as i32,
            batch: Bytes::from(batch),
        }
    }

    /// A record's offset delta, timestamp, key, value and header count.
    type Decoded = (i32, i64, Option<Bytes>, Option<Bytes>, usize);

    fn records_of(batch: &Bytes) -> Vec<Decoded> {
        let mut records = Records::of_batch(batch).expect("batch");
        let mut out = Vec::new();
        while let Some(r) = records.next_record().expect("record") {
            out.push((r.offset_delta, r.timestamp, r.key, r.value, r.headers.len()));
        }
        out
    }

    #[test]
    fn a_partly_kept_batch_keeps_its_offsets_timestamps_and_codec() {
        let tombstones = Tombstones {
            segments: vec![(0, 99, 1_000)],
            until: 0,
            tail: i64::MAX,
        };
        // a@10 b@11 a@12 c@13 b@14: a later "a" at 12 and "b" at 30.
        let latest = HashMap::from([
            (Bytes::from("a"), 12),
            (Bytes::from("b"), 30),
            (Bytes::from("c"), 13),
        ]);
        let plain = [
            ("a", Some("1")),
            ("b", Some("2")),
            ("a", Some("3")),
            ("c", None),
            ("b", Some("5")),
        ];
        for codec in 0..=4 {
            let entry = stored(10, &plain, codec);
            let kept = keep(&entry, &latest, &[], &tombstones).expect("kept");
            let (id, batch) = kept.batch.expect("something kept");
            assert_eq!(
                id, "14-5",
                "codec {codec}: the batch's last offset 14 (the last kept is 13), span from base 10"
            );
            assert_eq!((kept.read, kept.kept), (5, 2));
            let header = batch::header(&batch).unwrap();
            assert_eq!(header.attributes & 7, codec, "the batch's codec");
            assert_eq!(header.record_count, 2);
            assert_eq!(header.last_offset_delta, 4, "the original batch's");
            assert_eq!(header.base_timestamp, 1_000);
            assert_eq!(kept.tomb_sealed, Some(1_000), "the tombstone of c is kept");
            let records = records_of(&batch);
            assert_eq!(
                records,
                [
                    (2, 1_002, Some(Bytes::from("a")), Some(Bytes::from("3")), 1),
                    (3, 1_003, Some(Bytes::from("c")), None, 1),
                ],
                "codec {codec}"
            );
        }
    }

    /// The log's last batch keeps its last offset, its records without a
    /// key and its tombstones, but not a value its own tombstone (or any
    /// later record of its key) supersedes: kept, the value outlived the
    /// tombstone and came back once that expired.
    #[test]
    fn the_last_batch_drops_what_is_superseded_and_keeps_its_end() {
        let at_tail = Tombstones {
            segments: vec![(0, 99, 1_000)],
            until: 2_000,
            tail: 3,
        };
        // k=v@0, (no key)@1, k=tombstone@2, j=v@3: "k" is deleted at 2.
        let entry = stored(
            0,
            &[("k", Some("v")), ("", Some("x")), ("k", None), ("j", Some("w"))],
            0,
        );
        let mut records = Vec::new();
        let mut read = Records::of_batch(&entry.batch).unwrap();
        while let Some(mut record) = read.next_record().unwrap() {
            if record.offset_delta == 1 {
                record.key = None;
            }
            records.push(record);
        }
        let keyless = Entry {
            batch: batch::rebuild(&entry.batch, &records).expect("rebuilt"),
            ..entry
        };
        let latest = HashMap::from([(Bytes::from("k"), 2), (Bytes::from("j"), 3)]);
        let kept = keep(&keyless, &latest, &[], &at_tail).unwrap();
        let (id, batch) = kept.batch.expect("the end stays");
        assert_eq!(id, "3-4", "its last offset");
        let kept: Vec<(i32, Option<Bytes>)> = records_of(&batch)
            .into_iter()
            .map(|(delta, _, key, ..)| (delta, key))
            .collect();
        assert_eq!(
            kept,
            [
                (1, None),
                (2, Some(Bytes::from("k"))),
                (3, Some(Bytes::from("j")))
            ],
            "the superseded value of k goes; the keyless record, the tombstone and the end stay"
        );
    }

    #[test]
    fn whole_batches_stay_as_they_are_and_gone_ones_go() {
        let tombstones = Tombstones {
            segments: vec![(0, 99, 1_000)],
            until: 2_000,
            tail: i64::MAX,
        };
        let entry = stored(0, &[("x", Some("1")), ("y", Some("2"))], 0);
        let kept = keep(&entry, &HashMap::new(), &[], &tombstones).unwrap();
        assert_eq!(kept.batch, Some(("1-2".to_owned(), entry.batch.clone())));
        let superseded = HashMap::from([(Bytes::from("x"), 5), (Bytes::from("y"), 6)]);
        assert_eq!(keep(&entry, &superseded, &[], &tombstones).unwrap().batch, None);
        // Expired tombstones go; an aborted transaction's batch goes.
        let tomb = stored(0, &[("x", None)], 0);
        assert_eq!(
            keep(&tomb, &HashMap::new(), &[], &tombstones).unwrap().batch,
            None
        );
        // Unless it is the last batch of the log: the end stays.
        let at_tail = Tombstones {
            segments: vec![(0, 99, 1_000)],
            until: 2_000,
            tail: 0,
        };
        assert_eq!(
            keep(&tomb, &HashMap::new(), &[], &at_tail).unwrap().batch,
            Some(("0-1".to_owned(), tomb.batch.clone()))
        );
        let mut txn = stored(0, &[("x", Some("1"))], 0).batch.to_vec();
        txn[21..23].copy_from_slice(&0x10i16.to_be_bytes());
        txn[43..51].copy_from_slice(&7i64.to_be_bytes());
        let txn = Entry {
            last_offset: 0,
            record_count: 1,
            batch: Bytes::from(txn),
        };
        assert_eq!(
            keep(&txn, &HashMap::new(), &[(7, 0, 5)], &tombstones)
                .unwrap()
                .batch,
            None
        );
        assert!(
            keep(&txn, &HashMap::new(), &[(8, 0, 5)], &tombstones)
                .unwrap()
                .batch
                .is_some()
        );
    }

    #[test]
    fn tombstones_expire_by_their_segments_seal_time() {
        let t = Tombstones {
            segments: vec![(0, 9, 1_000), (10, 19, 5_000), (25, 30, 9_000)],
            until: 5_000,
            tail: i64::MAX,
        };
        assert_eq!(t.segment_of(0), Some((0, 1_000)));
        assert_eq!(t.segment_of(15), Some((10, 5_000)));
        assert_eq!(t.segment_of(22), None, "a hole between segments");
        assert!(t.expired(3));
        assert!(!t.expired(12), "sealed exactly at the horizon");
        assert!(!t.expired(40), "no segment (the open one) keeps its tombstones");
    }
}

//! The storage worker's and the remote reader's metrics, recorded with the
//! `metrics` crate (the gateway binary installs the Prometheus recorder;
//! docs/observability.md lists them).

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use metrics::{Counter, Gauge, Histogram, describe_counter, describe_gauge, describe_histogram};

/// Describes this crate's metrics to the installed recorder.
pub fn describe_metrics() {
    for (name, help) in COUNTERS {
        describe_counter!(*name, *help);
    }
    describe_gauge!(
        "ketch_archive_quarantined_segments",
        "Quarantined segments waiting for an operator (`ketch segments`), over the partitions this gateway works."
    );
    describe_histogram!(
        "ketch_archive_segment_seconds",
        "Time to archive one segment: reading it from Redis, writing its data file and committing it."
    );
    describe_histogram!(
        "ketch_compaction_seconds",
        "Time of one compaction pass over a partition."
    );
    describe_gauge!(
        "ketch_archive_lag_seconds",
        "Age of the oldest sealed segment not yet archived, over the partitions this gateway works."
    );
}

const COUNTERS: &[(&str, &str)] = &[
    (
        "ketch_compaction_passes_total",
        "Compaction passes this gateway finished over partitions of compacted topics.",
    ),
    (
        "ketch_compaction_records_read_total",
        "Records compaction passes read (the compacted part and the segments compacted).",
    ),
    (
        "ketch_compaction_records_removed_total",
        "Records compaction removed: superseded by a later record of their key, expired tombstones, aborted transactions' records.",
    ),
    (
        "ketch_compaction_failures_total",
        "Compaction passes that failed (retried on a later tick).",
    ),
    (
        "ketch_archive_segments_total",
        "Segments archived to Iceberg by this gateway.",
    ),
    (
        "ketch_archive_records_total",
        "Records archived to Iceberg by this gateway.",
    ),
    (
        "ketch_archive_bytes_total",
        "Bytes of Parquet data files written by this gateway.",
    ),
    (
        "ketch_archive_failures_total",
        "Failed attempts to archive a segment (retried on the next tick).",
    ),
    (
        "ketch_archive_quarantines_total",
        "Segments quarantined because the archive cannot write their records.",
    ),
    (
        "ketch_archive_snapshots_expired_total",
        "Snapshots of topic tables expired by this gateway's maintenance.",
    ),
    (
        "ketch_archive_metadata_files_deleted_total",
        "Manifest lists of expired snapshots and old table metadata files deleted by this gateway's maintenance.",
    ),
    (
        "ketch_archive_manifest_rewrites_total",
        "Commits by this gateway's maintenance that merged small manifests.",
    ),
    (
        "ketch_archive_manifests_merged_total",
        "Manifests those rewrites replaced.",
    ),
    (
        "ketch_archive_maintenance_failures_total",
        "Failed snapshot expiries and manifest rewrites (tried again after tiering.maintenance_commits more commits).",
    ),
    (
        "ketch_segments_sealed_total",
        "Segments sealed by this gateway's storage worker.",
    ),
    (
        "ketch_segments_deleted_total",
        "Segments deleted by retention.ms / retention.bytes.",
    ),
    (
        "ketch_remote_read_bytes_total",
        "Record batch bytes served from the archive.",
    ),
    (
        "ketch_remote_read_cache_hits_total",
        "Remote reads served from decoded row groups in memory.",
    ),
    (
        "ketch_remote_read_cache_misses_total",
        "Row groups read and decoded from the archive.",
    ),
    (
        "ketch_remote_read_failures_total",
        "Fetches of a partition's archived offsets that failed (answered KAFKA_STORAGE_ERROR): the object store refused or lost a data file, or it could not be decoded.",
    ),
    (
        "ketch_remote_read_timeouts_total",
        "Fetches of a partition's archived offsets answered with no records because the archive read outlasted tiering.remote_fetch_max_wait.",
    ),
];

/// The handles, taken when the storage worker and reader are made (after
/// the recorder is installed), and the per-partition gauges' sources.
pub struct Metrics {
    archived_segments: Counter,
    archived_records: Counter,
    archived_bytes: Counter,
    archive_seconds: Histogram,
    compaction_passes: Counter,
    compaction_read: Counter,
    compaction_removed: Counter,
    compaction_failures: Counter,
    compaction_seconds: Histogram,
    archive_failures: Counter,
    quarantines: Counter,
    snapshots_expired: Counter,
    metadata_files_deleted: Counter,
    manifest_rewrites: Counter,
    manifests_merged: Counter,
    maintenance_failures: Counter,
    sealed_segments: Counter,
    deleted_segments: Counter,
    remote_read_bytes: Counter,
    remote_cache_hits: Counter,
    remote_cache_misses: Counter,
    remote_read_failures: Counter,
    remote_read_timeouts: Counter,
    quarantined_gauge: Gauge,
    lag_gauge: Gauge,
    /// Age in ms of the oldest sealed segment not yet archived, per
    /// partition this gateway works (topic, partition → ms).
    lag: Mutex<std::collections::BTreeMap<(String, i32), i64>>,
    /// The last computed maximum, for cheap reads.
    lag_max_ms: AtomicI64,
    /// Quarantined segments per partition this gateway works.
    quarantined: Mutex<std::collections::BTreeMap<(String, i32), u64>>,
    /// Cache hits and misses, for this crate's tests.
    #[cfg(test)]
    cache: Mutex<(u64, u64)>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let c = |name: &'static str| metrics::counter!(name);
        Self {
            archived_segments: c("ketch_archive_segments_total"),
            archived_records: c("ketch_archive_records_total"),
            archived_bytes: c("ketch_archive_bytes_total"),
            archive_seconds: metrics::histogram!("ketch_archive_segment_seconds"),
            compaction_passes: c("ketch_compaction_passes_total"),
            compaction_read: c("ketch_compaction_records_read_total"),
            compaction_removed: c("ketch_compaction_records_removed_total"),
            compaction_failures: c("ketch_compaction_failures_total"),
            compaction_seconds: metrics::histogram!("ketch_compaction_seconds"),
            archive_failures: c("ketch_archive_failures_total"),
            quarantines: c("ketch_archive_quarantines_total"),
            snapshots_expired: c("ketch_archive_snapshots_expired_total"),
            metadata_files_deleted: c("ketch_archive_metadata_files_deleted_total"),
            manifest_rewrites: c("ketch_archive_manifest_rewrites_total"),
            manifests_merged: c("ketch_archive_manifests_merged_total"),
            maintenance_failures: c("ketch_archive_maintenance_failures_total"),
            sealed_segments: c("ketch_segments_sealed_total"),
            deleted_segments: c("ketch_segments_deleted_total"),
            remote_read_bytes: c("ketch_remote_read_bytes_total"),
            remote_cache_hits: c("ketch_remote_read_cache_hits_total"),
            remote_cache_misses: c("ketch_remote_read_cache_misses_total"),
            remote_read_failures: c("ketch_remote_read_failures_total"),
            remote_read_timeouts: c("ketch_remote_read_timeouts_total"),
            quarantined_gauge: metrics::gauge!("ketch_archive_quarantined_segments"),
            lag_gauge: metrics::gauge!("ketch_archive_lag_seconds"),
            lag: Mutex::default(),
            lag_max_ms: AtomicI64::new(0),
            quarantined: Mutex::default(),
            #[cfg(test)]
            cache: Mutex::default(),
        }
    }
}

impl Metrics {
    /// A segment of `records` records was archived into a data file of
    /// `file_bytes` bytes, in `took`.
    pub fn archived(&self, records: u64, file_bytes: u64, took: std::time::Duration) {
        self.archive_seconds.record(took.as_secs_f64());
        self.archived_segments.increment(1);
        self.archived_records.increment(records);
        self.archived_bytes.increment(file_bytes);
    }

    /// A compaction pass read `read` records and kept `kept`, in `took`.
    pub fn compacted(&self, read: u64, kept: u64, took: std::time::Duration) {
        self.compaction_seconds.record(took.as_secs_f64());
        self.compaction_passes.increment(1);
        self.compaction_read.increment(read);
        self.compaction_removed.increment(read.saturating_sub(kept));
    }

    pub fn compaction_failed(&self) {
        self.compaction_failures.increment(1);
    }

    pub fn archive_failed(&self) {
        self.archive_failures.increment(1);
    }

    /// A segment was quarantined.
    pub fn quarantined(&self) {
        self.quarantines.increment(1);
    }

    /// An expiry removed `snapshots` and deleted `files` metadata files.
    pub fn snapshots_expired(&self, snapshots: u64, files: u64) {
        self.snapshots_expired.increment(snapshots);
        self.metadata_files_deleted.increment(files);
    }

    /// A manifest rewrite replaced `merged` manifests.
    pub fn manifests_rewritten(&self, merged: u64) {
        self.manifest_rewrites.increment(1);
        self.manifests_merged.increment(merged);
    }

    pub fn maintenance_failed(&self) {
        self.maintenance_failures.increment(1);
    }

    /// Sets how many quarantined segments a partition has.
    pub fn set_quarantined(&self, topic: &str, partition: i32, segments: u64) {
        let mut quarantined = self.quarantined.lock().expect("quarantined");
        if segments > 0 {
            quarantined.insert((topic.to_owned(), partition), segments);
        } else {
            quarantined.remove(&(topic.to_owned(), partition));
        }
        drop(quarantined);
        self.refresh_gauges();
    }

    pub fn sealed(&self, sealed: u64, deleted: u64) {
        self.sealed_segments.increment(sealed);
        self.deleted_segments.increment(deleted);
    }

    /// A fetch's archive read failed.
    pub fn remote_read_failed(&self) {
        self.remote_read_failures.increment(1);
    }

    /// A fetch's archive read outlasted `tiering.remote_fetch_max_wait`.
    pub fn remote_read_timed_out(&self) {
        self.remote_read_timeouts.increment(1);
    }

    pub fn remote_read(&self, bytes: u64) {
        self.remote_read_bytes.increment(bytes);
    }

    pub fn cache_hit(&self) {
        self.remote_cache_hits.increment(1);
        #[cfg(test)]
        {
            self.cache.lock().expect("cache").0 += 1;
        }
    }

    pub fn cache_miss(&self) {
        self.remote_cache_misses.increment(1);
        #[cfg(test)]
        {
            self.cache.lock().expect("cache").1 += 1;
        }
    }

    /// Slices served from memory and read from the archive.
    #[cfg(test)]
    pub(crate) fn remote_cache(&self) -> (u64, u64) {
        *self.cache.lock().expect("cache")
    }

    /// Sets the gauges again (the exporter drops gauges left unset).
    pub fn refresh_gauges(&self) {
        let quarantined: u64 = self.quarantined.lock().expect("quarantined").values().sum();
        self.quarantined_gauge.set(quarantined as f64);
        self.lag_gauge
            .set(self.lag_max_ms.load(Ordering::Relaxed) as f64 / 1000.0);
    }

    /// Sets a partition's archive lag (0: nothing waits).
    pub fn set_lag(&self, topic: &str, partition: i32, lag_ms: i64) {
        let mut lag = self.lag.lock().expect("lag");
        if lag_ms > 0 {
            lag.insert((topic.to_owned(), partition), lag_ms);
        } else {
            lag.remove(&(topic.to_owned(), partition));
        }
        self.lag_max_ms
            .store(lag.values().copied().max().unwrap_or(0), Ordering::Relaxed);
        drop(lag);
        self.refresh_gauges();
    }

    /// Forgets partitions this gateway no longer works.
    pub fn retain_lag(&self, keep: impl Fn(&str, i32) -> bool) {
        (self.quarantined.lock().expect("quarantined"))
            .retain(|(topic, partition), _| keep(topic, *partition));
        let mut lag = self.lag.lock().expect("lag");
        lag.retain(|(topic, partition), _| keep(topic, *partition));
        self.lag_max_ms
            .store(lag.values().copied().max().unwrap_or(0), Ordering::Relaxed);
        drop(lag);
        self.refresh_gauges();
    }
}

//! The storage worker's and the remote reader's counters, rendered in the
//! Prometheus text format at the gateway's `/metrics`.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Counters since this gateway started, and the archive lag gauge.
#[derive(Debug, Default)]
pub struct Metrics {
    archived_segments: AtomicU64,
    archived_records: AtomicU64,
    archived_bytes: AtomicU64,
    archive_failures: AtomicU64,
    quarantines: AtomicU64,
    snapshots_expired: AtomicU64,
    metadata_files_deleted: AtomicU64,
    manifest_rewrites: AtomicU64,
    manifests_merged: AtomicU64,
    maintenance_failures: AtomicU64,
    sealed_segments: AtomicU64,
    deleted_segments: AtomicU64,
    remote_read_bytes: AtomicU64,
    remote_cache_hits: AtomicU64,
    remote_cache_misses: AtomicU64,
    /// Age in ms of the oldest sealed segment not yet archived, per
    /// partition this gateway works (topic, partition → ms).
    lag: Mutex<std::collections::BTreeMap<(String, i32), i64>>,
    /// The last computed maximum, for cheap reads.
    lag_max_ms: AtomicI64,
    /// Quarantined segments per partition this gateway works.
    quarantined: Mutex<std::collections::BTreeMap<(String, i32), u64>>,
}

impl Metrics {
    pub fn archived(&self, records: u64, file_bytes: u64) {
        self.archived_segments.fetch_add(1, Ordering::Relaxed);
        self.archived_records.fetch_add(records, Ordering::Relaxed);
        self.archived_bytes.fetch_add(file_bytes, Ordering::Relaxed);
    }

    pub fn archive_failed(&self) {
        self.archive_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A segment was quarantined.
    pub fn quarantined(&self) {
        self.quarantines.fetch_add(1, Ordering::Relaxed);
    }

    /// An expiry removed `snapshots` and deleted `files` metadata files.
    pub fn snapshots_expired(&self, snapshots: u64, files: u64) {
        self.snapshots_expired.fetch_add(snapshots, Ordering::Relaxed);
        self.metadata_files_deleted.fetch_add(files, Ordering::Relaxed);
    }

    /// A manifest rewrite replaced `merged` manifests.
    pub fn manifests_rewritten(&self, merged: u64) {
        self.manifest_rewrites.fetch_add(1, Ordering::Relaxed);
        self.manifests_merged.fetch_add(merged, Ordering::Relaxed);
    }

    pub fn maintenance_failed(&self) {
        self.maintenance_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets how many quarantined segments a partition has.
    pub fn set_quarantined(&self, topic: &str, partition: i32, segments: u64) {
        let mut quarantined = self.quarantined.lock().expect("quarantined");
        if segments > 0 {
            quarantined.insert((topic.to_owned(), partition), segments);
        } else {
            quarantined.remove(&(topic.to_owned(), partition));
        }
    }

    pub fn sealed(&self, sealed: u64, deleted: u64) {
        self.sealed_segments.fetch_add(sealed, Ordering::Relaxed);
        self.deleted_segments.fetch_add(deleted, Ordering::Relaxed);
    }

    pub fn remote_read(&self, bytes: u64) {
        self.remote_read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn cache_hit(&self) {
        self.remote_cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cache_miss(&self) {
        self.remote_cache_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Slices served from memory and read from the archive.
    #[cfg(test)]
    pub(crate) fn remote_cache(&self) -> (u64, u64) {
        (
            self.remote_cache_hits.load(Ordering::Relaxed),
            self.remote_cache_misses.load(Ordering::Relaxed),
        )
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
    }

    /// Forgets partitions this gateway no longer works.
    pub fn retain_lag(&self, keep: impl Fn(&str, i32) -> bool) {
        (self.quarantined.lock().expect("quarantined"))
            .retain(|(topic, partition), _| keep(topic, *partition));
        let mut lag = self.lag.lock().expect("lag");
        lag.retain(|(topic, partition), _| keep(topic, *partition));
        self.lag_max_ms
            .store(lag.values().copied().max().unwrap_or(0), Ordering::Relaxed);
    }

    pub fn archived_segments(&self) -> u64 {
        self.archived_segments.load(Ordering::Relaxed)
    }

    pub fn archive_failures(&self) -> u64 {
        self.archive_failures.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of these metrics.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            "ketch_archive_segments_total",
            "Segments archived to Iceberg by this gateway.",
            get(&self.archived_segments),
        );
        counter(
            "ketch_archive_records_total",
            "Records archived to Iceberg by this gateway.",
            get(&self.archived_records),
        );
        counter(
            "ketch_archive_bytes_total",
            "Bytes of Parquet data files written by this gateway.",
            get(&self.archived_bytes),
        );
        counter(
            "ketch_archive_failures_total",
            "Failed attempts to archive a segment (retried on the next tick).",
            get(&self.archive_failures),
        );
        counter(
            "ketch_archive_quarantines_total",
            "Segments quarantined because the archive cannot write their records.",
            get(&self.quarantines),
        );
        counter(
            "ketch_archive_snapshots_expired_total",
            "Snapshots of topic tables expired by this gateway's maintenance.",
            get(&self.snapshots_expired),
        );
        counter(
            "ketch_archive_metadata_files_deleted_total",
            "Manifest lists of expired snapshots and old table metadata files deleted by this gateway's maintenance.",
            get(&self.metadata_files_deleted),
        );
        counter(
            "ketch_archive_manifest_rewrites_total",
            "Commits by this gateway's maintenance that merged small manifests.",
            get(&self.manifest_rewrites),
        );
        counter(
            "ketch_archive_manifests_merged_total",
            "Manifests those rewrites replaced.",
            get(&self.manifests_merged),
        );
        counter(
            "ketch_archive_maintenance_failures_total",
            "Failed snapshot expiries and manifest rewrites (tried again after tiering.maintenance_commits more commits).",
            get(&self.maintenance_failures),
        );
        counter(
            "ketch_segments_sealed_total",
            "Segments sealed by this gateway's storage worker.",
            get(&self.sealed_segments),
        );
        counter(
            "ketch_segments_deleted_total",
            "Segments deleted by retention.ms / retention.bytes.",
            get(&self.deleted_segments),
        );
        counter(
            "ketch_remote_read_bytes_total",
            "Record batch bytes served from the archive.",
            get(&self.remote_read_bytes),
        );
        counter(
            "ketch_remote_read_cache_hits_total",
            "Remote reads served from decoded row groups in memory.",
            get(&self.remote_cache_hits),
        );
        counter(
            "ketch_remote_read_cache_misses_total",
            "Row groups read and decoded from the archive.",
            get(&self.remote_cache_misses),
        );
        let quarantined: u64 = self.quarantined.lock().expect("quarantined").values().sum();
        let _ = writeln!(
            out,
            "# HELP ketch_archive_quarantined_segments Quarantined segments waiting for an operator (`ketch segments`), over the partitions this gateway works.\n# TYPE ketch_archive_quarantined_segments gauge\nketch_archive_quarantined_segments {quarantined}"
        );
        let lag = self.lag_max_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "# HELP ketch_archive_lag_seconds Age of the oldest sealed segment not yet archived, over the partitions this gateway works.\n# TYPE ketch_archive_lag_seconds gauge\nketch_archive_lag_seconds {lag}"
        );
        out
    }
}

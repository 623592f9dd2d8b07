//! A real archive for tests: the embedded SQL catalog (SQLite) and a local
//! warehouse in a temporary directory, and segments archived through
//! [`Archiver::start`]'s feeding and [`Archiver::finish`] from batches made
//! in memory.

use std::collections::BTreeSet;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use futures::TryStreamExt;
use iceberg::table::Table;
use ketch_config::TieringSettings;
use ketch_storage::Topic;
use ketch_storage::batch::BatchBuilder;
use ketch_storage::segments::Segment;

use crate::archive::{Archived, Archiver, Chunks, Fed};

pub struct Lake {
    pub archiver: Archiver,
    pub topic: Topic,
    _dir: tempfile::TempDir,
}

impl Lake {
    pub fn new(change: impl FnOnce(&mut TieringSettings)) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut settings = TieringSettings {
            data_dir: dir.path().display().to_string(),
            ..TieringSettings::default()
        };
        change(&mut settings);
        let mut topic: Topic = serde_json::from_value(serde_json::json!({
            "id": uuid::Uuid::new_v4(),
            "tags": ["a", "b"],
            "configs": {},
        }))
        .expect("a topic record");
        topic.name = "events".to_owned();
        Self {
            archiver: Archiver::new(settings),
            topic,
            _dir: dir,
        }
    }

    /// The files under the lake's directory whose names end in `suffix`.
    pub fn files(&self, suffix: &str) -> Vec<std::path::PathBuf> {
        fn walk(dir: &std::path::Path, suffix: &str, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("a directory").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, suffix, found);
                } else if path.to_string_lossy().ends_with(suffix) {
                    found.push(path);
                }
            }
        }
        let mut found = Vec::new();
        walk(self._dir.path(), suffix, &mut found);
        found
    }

    pub async fn table(&self) -> Table {
        self.archiver.table(&self.topic).await.expect("the topic's table")
    }

    /// Archives `records` records from offset `base` of `partition`
    /// ([`Lake::start`], then [`Lake::finish`]).
    pub async fn archive(&self, table: &mut Table, partition: i32, base: i64, records: i64) -> Archived {
        let fed = self.start(table, partition, base, records).await;
        self.finish(table, partition, base, records, fed).await
    }

    /// Hands `records` records from offset `base` of `partition` to their
    /// data file's writer ([`Archiver::start`]), reading `table`.
    pub async fn start(&self, table: &Table, partition: i32, base: i64, records: i64) -> Fed {
        self.archiver
            .feed(
                table,
                &self.topic,
                partition,
                &segment(base, records),
                one_batch(base, records),
                &crate::archive::Filter::default(),
            )
            .await
            .expect("fed")
    }

    /// Commits what [`Lake::start`] fed ([`Archiver::finish`]).
    pub async fn finish(
        &self,
        table: &mut Table,
        partition: i32,
        base: i64,
        records: i64,
        fed: Fed,
    ) -> Archived {
        self.archiver
            .finish(
                table,
                &self.topic,
                partition,
                &segment(base, records),
                fed,
                &crate::archive::Unfenced,
            )
            .await
            .expect("archived")
    }
}

/// `records` records from offset `base`, in one batch.
fn one_batch(base: i64, records: i64) -> OneBatch {
    let mut batch = BatchBuilder::new(base);
    for offset in base..base + records {
        let value = format!("record {offset}");
        batch.push(offset, None, Some(value.as_bytes()), std::iter::empty());
    }
    OneBatch(batch.finish(), base + records)
}

pub fn segment(base: i64, records: i64) -> Segment {
    serde_json::from_value(serde_json::json!({
        "base": base,
        "last": base + records - 1,
        "bytes": 0,
        "max_ts": base + records - 1,
        "sealed_ms": 0,
    }))
    .expect("a segment record")
}

/// Every (partition, offset) a scan of the table's current snapshot reads.
pub async fn rows(table: &Table) -> BTreeSet<(i32, i64)> {
    scan(table, &["partition", "offset"])
        .await
        .iter()
        .flat_map(|batch| {
            let partitions = batch.column(0).as_primitive::<Int32Type>().clone();
            let offsets = batch.column(1).as_primitive::<Int64Type>().clone();
            (0..batch.num_rows()).map(move |i| (partitions.value(i), offsets.value(i)))
        })
        .collect()
}

/// The `columns` of every row a scan of the table's current snapshot reads.
pub async fn scan(table: &Table, columns: &[&str]) -> Vec<arrow_array::RecordBatch> {
    table
        .scan()
        .select(columns.iter().copied())
        .build()
        .expect("a scan")
        .to_arrow()
        .await
        .expect("a scan")
        .try_collect()
        .await
        .expect("the rows")
}

/// The data files the current snapshot's manifests list as live.
pub async fn live_files(table: &Table) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for manifest in crate::maintenance::manifests(table)
        .await
        .expect("the manifest list")
    {
        let manifest = manifest.load_manifest(table.file_io()).await.expect("a manifest");
        files.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| e.is_alive())
                .map(|e| e.file_path().to_owned()),
        );
    }
    files
}

/// A segment of one batch, offsets up to `.1`.
struct OneBatch(bytes::Bytes, i64);

impl Chunks for OneBatch {
    fn chunk(
        &mut self,
        _next: i64,
    ) -> impl Future<Output = ketch_storage::Result<(Vec<bytes::Bytes>, i64)>> + Send {
        std::future::ready(Ok((vec![self.0.clone()], self.1)))
    }
}

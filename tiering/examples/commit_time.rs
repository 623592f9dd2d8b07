//! How the cost of an archive commit grows with the segments archived, with
//! table maintenance off and on.
//!
//! Archives tiny segments (10 records each, alternating between two
//! partitions) to one table of the embedded catalog (SQLite + a local
//! warehouse) through `Archiver::archive_from`, the storage worker's own
//! path minus Redis, and prints the time per segment for every 100, three
//! times: maintenance off; on with the default `snapshot_retention` (1h, so
//! a run of a few minutes expires nothing: only manifests are merged); on
//! with a retention of 0 (only the newest `snapshots_kept` stay, as at a
//! commit rate so low that an hour holds fewer). With maintenance on, the
//! table is maintained after every `maintenance_commits` commits, as the
//! storage worker does.
//!
//! ```sh
//! cargo run --release -p ketch-tiering --example commit_time -- [segments] [maintenance_commits] [keep in]
//! ```
//!
//! With a third argument, the tables are kept in that directory (`off/`,
//! `on-1h/`, `on-0s/`, each with its `catalog.db` and `warehouse/`) for
//! other engines to read; otherwise they go with a temporary directory.

use std::time::{Duration, Instant};

use iceberg::table::Table;
use ketch_config::TieringSettings;
use ketch_storage::Topic;
use ketch_storage::batch::BatchBuilder;
use ketch_storage::segments::Segment;
use ketch_tiering::Archiver;
use ketch_tiering::archive::Chunks;
use ketch_tiering::maintenance::manifests;

const RECORDS: i64 = 10;
const WINDOW: usize = 100;

/// Per window of [`WINDOW`] segments: archiving time and maintenance time.
struct Run {
    archive: Vec<Duration>,
    maintenance: Vec<Duration>,
    slowest: Vec<Duration>,
    snapshots: usize,
    manifests: usize,
    metadata_bytes: u64,
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let segments: usize = args.next().map_or(1000, |n| n.parse().expect("segments"));
    let every: u32 = args
        .next()
        .map_or(20, |n| n.parse().expect("maintenance_commits"));
    let keep = args.next().map(std::path::PathBuf::from);
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let home = keep.as_deref().unwrap_or(scratch.path());
    let defaults = TieringSettings::default();
    let configurations = [
        ("off", 0, defaults.snapshot_retention),
        ("on-1h", every, defaults.snapshot_retention),
        ("on-0s", every, ketch_config::Duration::from_millis(0)),
    ];
    println!(
        "{segments} segments of {RECORDS} records; maintenance every {every} commits, snapshots_kept {}",
        defaults.snapshots_kept
    );
    let mut runs = Vec::new();
    for (name, every, retention) in configurations {
        let settings = TieringSettings {
            data_dir: home.join(name).display().to_string(),
            maintenance_commits: every,
            snapshot_retention: retention,
            ..TieringSettings::default()
        };
        runs.push((name, run(settings, segments).await));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    print!("segments  ");
    for (name, _) in &runs {
        print!("| {name:>5}: ms/segment (slowest), maintenance ms/segment ");
    }
    println!();
    for w in 0..segments.div_ceil(WINDOW) {
        let (first, last) = (w * WINDOW + 1, ((w + 1) * WINDOW).min(segments));
        let per = |d: Duration| ms(d) / (last + 1 - first) as f64;
        print!("{first:>4}-{last:<5}");
        for (_, run) in &runs {
            print!(
                "| {:>16.1} ({:>6.1}), {:>26.2} ",
                per(run.archive[w]),
                ms(run.slowest[w]),
                per(run.maintenance[w])
            );
        }
        println!();
    }
    for (name, run) in &runs {
        println!(
            "{name}: {} snapshots, {} manifests in the current snapshot, metadata file {} KiB",
            run.snapshots,
            run.manifests,
            run.metadata_bytes / 1024
        );
    }
}

async fn run(settings: TieringSettings, segments: usize) -> Run {
    let every = settings.maintenance_commits;
    let archiver = Archiver::new(settings);
    let mut topic: Topic = serde_json::from_value(serde_json::json!({
        "id": uuid::Uuid::new_v4(),
        "tags": ["a", "b"],
        "configs": {},
    }))
    .expect("a topic record");
    topic.name = "bench".to_owned();
    let mut table = archiver.table(&topic).await.expect("the table");
    let mut run = Run {
        archive: Vec::new(),
        maintenance: Vec::new(),
        slowest: Vec::new(),
        snapshots: 0,
        manifests: 0,
        metadata_bytes: 0,
    };
    for n in 0..segments {
        if n % WINDOW == 0 {
            run.archive.push(Duration::ZERO);
            run.maintenance.push(Duration::ZERO);
            run.slowest.push(Duration::ZERO);
        }
        let started = Instant::now();
        archive(&archiver, &mut table, &topic, n).await;
        let took = started.elapsed();
        *run.archive.last_mut().expect("a window") += took;
        let slowest = run.slowest.last_mut().expect("a window");
        *slowest = (*slowest).max(took);
        if every > 0 && (n + 1) % every as usize == 0 {
            let started = Instant::now();
            archiver.expire_snapshots(&mut table).await.expect("expiry");
            archiver.rewrite_manifests(&mut table).await.expect("rewrite");
            *run.maintenance.last_mut().expect("a window") += started.elapsed();
        }
    }
    let table = archiver.table(&topic).await.expect("the table");
    run.snapshots = table.metadata().snapshots().count();
    run.manifests = manifests(&table).await.expect("the manifests").len();
    let location = table.metadata_location().expect("a metadata file");
    run.metadata_bytes = std::fs::metadata(location.trim_start_matches("file://")).map_or(0, |m| m.len());
    run
}

async fn archive(archiver: &Archiver, table: &mut Table, topic: &Topic, n: usize) {
    let partition = (n % 2) as i32;
    let base = n as i64 * RECORDS;
    let segment: Segment = serde_json::from_value(serde_json::json!({
        "base": base,
        "last": base + RECORDS - 1,
        "bytes": 0,
        "max_ts": base,
        "sealed_ms": 0,
    }))
    .expect("a segment record");
    let mut batch = BatchBuilder::new(base);
    for offset in base..base + RECORDS {
        batch.push(offset, None, Some(b"a tiny record"), std::iter::empty());
    }
    let batch = batch.finish();
    let after = segment.last + 1;
    let archived = archiver
        .archive_from(
            table,
            topic,
            partition,
            &segment,
            OneBatch(batch, after),
            &Default::default(),
            &ketch_tiering::archive::Unfenced,
        )
        .await
        .expect("archived");
    assert!(archived.written);
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

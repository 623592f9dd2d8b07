//! The CPU time archiving takes per record, without Redis or an object
//! store: segments of 100-byte records (a 38-byte structured prefix, as
//! ketch-bench's envelope, then random bytes) in batches of about 1 MiB are
//! archived through `Archiver::archive_from`, the storage worker's own path,
//! to a table of the embedded catalog on a local warehouse; prints records
//! per second and the process's CPU time per record (user + system).
//!
//! ```sh
//! cargo run --release -p ketch-tiering --example archive_cpu -- [segments] [records per segment]
//! ```
//!
//! Run it under `valgrind --tool=callgrind` for instructions per record,
//! which do not vary with the machine's load.

use std::time::Instant;

use bytes::Bytes;
use ketch_config::TieringSettings;
use ketch_storage::Topic;
use ketch_storage::batch::BatchBuilder;
use ketch_storage::segments::Segment;
use ketch_tiering::Archiver;
use ketch_tiering::archive::Chunks;

const RECORD_BYTES: usize = 100;
const BATCH_RECORDS: usize = 10_000;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let segments: usize = args.next().map_or(3, |n| n.parse().expect("segments"));
    let records: usize = args
        .next()
        .map_or(500_000, |n| n.parse().expect("records per segment"));
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let archiver = Archiver::new(TieringSettings {
        data_dir: scratch.path().display().to_string(),
        ..TieringSettings::default()
    });
    let mut topic: Topic = serde_json::from_value(serde_json::json!({
        "id": uuid::Uuid::new_v4(),
        "tags": ["a"],
        "configs": {},
    }))
    .expect("a topic record");
    topic.name = "bench".to_owned();
    let mut table = archiver.table(&topic).await.expect("the table");
    let batches: Vec<Vec<Bytes>> = (0..segments).map(|n| segment_batches(n, records)).collect();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    for (n, batches) in batches.into_iter().enumerate() {
        let base = (n * records) as i64;
        let segment: Segment = serde_json::from_value(serde_json::json!({
            "base": base,
            "last": base + records as i64 - 1,
            "bytes": 0,
            "max_ts": base,
            "sealed_ms": 0,
        }))
        .expect("a segment record");
        let archived = archiver
            .archive_from(
                &mut table,
                &topic,
                0,
                &segment,
                InMemory { batches, next: 0 },
                &Default::default(),
                &ketch_tiering::archive::Unfenced,
            )
            .await
            .expect("archived");
        assert!(archived.written);
    }
    let (seconds, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    let total = (segments * records) as f64;
    println!(
        "{segments} segments of {records} records of {RECORD_BYTES} B: {:.0} records/s, {:.3} µs CPU per record",
        total / seconds,
        cpu * 1e6 / total
    );
}

/// A segment's batches, their base offsets set.
fn segment_batches(n: usize, records: usize) -> Vec<Bytes> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let base = n * records;
    let mut batches = Vec::new();
    let mut offset = base;
    while offset < base + records {
        let mut batch = BatchBuilder::new(offset as i64);
        for _ in 0..BATCH_RECORDS.min(base + records - offset) {
            let mut value = [0u8; RECORD_BYTES];
            value[..8].copy_from_slice(&(offset as u64).to_be_bytes());
            value[8..16].copy_from_slice(&1_700_000_000_000u64.to_be_bytes());
            for chunk in value[38..].chunks_mut(8) {
                let bytes = random().to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
            batch.push(
                1_700_000_000_000 + offset as i64 / 1000,
                None,
                Some(&value),
                std::iter::empty(),
            );
            offset += 1;
        }
        batches.push(batch.finish());
    }
    batches
}

/// A segment's batches, a few at a time.
struct InMemory {
    batches: Vec<Bytes>,
    next: usize,
}

impl Chunks for InMemory {
    fn chunk(&mut self, _next: i64) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send {
        let chunk: Vec<Bytes> = self.batches[self.next..].iter().take(4).cloned().collect();
        self.next += chunk.len();
        let after = self.batches.get(self.next).map_or(i64::MAX, |b| {
            i64::from_be_bytes(b[0..8].try_into().expect("a base offset"))
        });
        std::future::ready(Ok((chunk, after)))
    }
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat.rsplit(") ").next().expect("fields").split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

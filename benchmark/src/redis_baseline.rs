//! `ketch-bench redis-xadd`: the direct-Redis baseline. Writes records
//! straight into one Redis stream, one `XADD key * v <payload>` per record,
//! pipelined, as a team without ketch would, so ketch's figures have
//! something to be compared with on the same machine.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::args::{CommonArgs, parse_size};
use crate::lock;
use crate::payload::{DEFAULT_SEED, PayloadKind, PayloadPool};
use crate::report::{LatencySummary, Sample, Session, Throughput, latency_histogram};
use crate::workload::Workload;

/// `ketch-bench redis-xadd`
#[derive(clap::Args, Debug)]
pub struct RedisXaddCmd {
    /// The Redis server to write to.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// The stream key written to.
    #[arg(long, default_value = "ketch-bench:baseline")]
    pub stream: String,
    /// Take the record size from this preset unless --record-size is given.
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Records to write in total, split among clients.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Bytes per record value: 100B, 1KB (=1024), 1MB [default: the workload's, else 1KB].
    #[arg(long, value_parser = parse_size)]
    pub record_size: Option<usize>,
    /// Value bytes: zeros, or slices of a seeded random pool.
    #[arg(long, value_enum, default_value_t = PayloadKind::Random)]
    pub payload: PayloadKind,
    /// Seed of the random payload pool.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// XADD commands per pipeline.
    #[arg(long, default_value_t = 1000)]
    pub pipeline: usize,
    /// Connections, each on its own thread.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Delete the stream before starting.
    #[arg(long)]
    pub delete_first: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Serialize, Debug)]
struct XaddParams {
    workload: Option<String>,
    redis_url: String,
    stream: String,
    records: u64,
    record_size: usize,
    payload: PayloadKind,
    seed: u64,
    pipeline: usize,
    clients: usize,
}

#[derive(Serialize, Debug)]
struct XaddFigures {
    throughput: Throughput,
    pipeline_latency: LatencySummary,
}

/// What one connection has written so far.
struct WriterStats {
    records: u64,
    bytes: u64,
    pipeline_us: Histogram<u64>,
}

/// `ketch-bench redis-xadd`: write, report.
pub fn run(cmd: &RedisXaddCmd) -> anyhow::Result<Vec<String>> {
    ensure!(
        cmd.clients > 0 && cmd.pipeline > 0,
        "--clients and --pipeline must be at least 1"
    );
    let record_size = cmd
        .record_size
        .or(cmd.workload.map(|w| w.preset().record_size))
        .unwrap_or(1024);
    let client = redis::Client::open(cmd.redis_url.as_str()).context("parsing --redis-url")?;
    if cmd.delete_first {
        let mut connection = client.get_connection().context("connecting to Redis")?;
        redis::cmd("DEL").arg(&cmd.stream).exec(&mut connection)?;
    }
    let params = XaddParams {
        workload: cmd.workload.map(|w| w.name()),
        redis_url: cmd.redis_url.clone(),
        stream: cmd.stream.clone(),
        records: cmd.records,
        record_size,
        payload: cmd.payload,
        seed: cmd.seed,
        pipeline: cmd.pipeline,
        clients: cmd.clients,
    };
    let pool = Arc::new(PayloadPool::new(cmd.payload, record_size, cmd.seed));
    let mut session = Session::begin("redis-xadd", &cmd.common)?;
    let writers = start_writers(cmd, &client, &pool)?;
    let finished = || writers.iter().all(|(thread, _)| thread.is_finished());
    session.progress.watch(finished, || totals(&writers).0);
    let (sample, histogram) = totals(&writers);
    // The run ends when the last writer had its last reply, not when the
    // watch above, polling, noticed.
    let mut last = session.start();
    for (thread, _) in writers {
        let done = thread
            .join()
            .map_err(|_| anyhow::anyhow!("a writer thread panicked"))??;
        last = last.max(done);
    }
    let elapsed = last - session.start();
    let figures = XaddFigures {
        throughput: Throughput::new(sample.records, sample.bytes, elapsed),
        pipeline_latency: LatencySummary::of(&histogram),
    };
    session.finish(params, figures, sample.records)?;
    Ok(Vec::new())
}

/// A writer's thread (answering when it had its last reply) and its figures.
type Writer = (JoinHandle<anyhow::Result<Instant>>, Arc<Mutex<WriterStats>>);

fn start_writers(
    cmd: &RedisXaddCmd,
    client: &redis::Client,
    pool: &Arc<PayloadPool>,
) -> anyhow::Result<Vec<Writer>> {
    let clients = cmd.clients as u64;
    let mut writers = Vec::new();
    for id in 0..clients {
        let quota = cmd.records / clients + u64::from(id < cmd.records % clients);
        let connection = client.get_connection().context("connecting to Redis")?;
        let stats = Arc::new(Mutex::new(WriterStats {
            records: 0,
            bytes: 0,
            pipeline_us: latency_histogram(),
        }));
        let (pool, stream, pipeline) = (Arc::clone(pool), cmd.stream.clone(), cmd.pipeline);
        let shared = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name(format!("xadd-{id}"))
            .spawn(move || write(connection, &pool, id, &stream, pipeline, quota, &shared))?;
        writers.push((thread, stats));
    }
    Ok(writers)
}

/// Writes `quota` records in pipelines of `pipeline` XADDs, timing each
/// pipeline; answers when the last pipeline's replies were in.
fn write(
    mut connection: redis::Connection,
    pool: &PayloadPool,
    id: u64,
    stream: &str,
    pipeline: usize,
    quota: u64,
    stats: &Mutex<WriterStats>,
) -> anyhow::Result<Instant> {
    let mut picker = pool.picker(id);
    let mut written = 0u64;
    while written < quota {
        let batch = (quota - written).min(pipeline as u64);
        let mut pipe = redis::pipe();
        let mut bytes = 0u64;
        for _ in 0..batch {
            let value = picker.next_value();
            bytes += value.len() as u64;
            pipe.cmd("XADD").arg(stream).arg("*").arg("v").arg(value).ignore();
        }
        let sent_at = Instant::now();
        pipe.exec(&mut connection).context("XADD pipeline")?;
        let took = sent_at.elapsed();
        record(stats, batch, bytes, took);
        written += batch;
    }
    Ok(Instant::now())
}

fn record(stats: &Mutex<WriterStats>, records: u64, bytes: u64, took: Duration) {
    let mut stats = lock(stats);
    stats.records += records;
    stats.bytes += bytes;
    stats
        .pipeline_us
        .saturating_record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1));
}

fn totals(writers: &[Writer]) -> (Sample, Histogram<u64>) {
    let mut sample = Sample::default();
    let mut histogram = latency_histogram();
    for (_, stats) in writers {
        let stats = lock(stats);
        sample.records += stats.records;
        sample.bytes += stats.bytes;
        histogram
            .add(&stats.pipeline_us)
            .expect("histograms share bounds");
    }
    if !histogram.is_empty() {
        sample.p99_us = Some(histogram.value_at_quantile(0.99));
    }
    (sample, histogram)
}

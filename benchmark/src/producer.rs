//! The producing side: N independent rdkafka `BaseProducer`s, one a thread,
//! each paced to its share of `--rate`. Every record is timed from its
//! *scheduled* send time to its acknowledgement, so a stalled broker cannot
//! hide latency by holding the sender back (coordinated omission).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use hdrhistogram::Histogram;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use serde::Serialize;

use crate::args::{KafkaArgs, ProduceArgs, Rate};
use crate::envelope::{ENVELOPE_LEN, Envelope};
use crate::kafka::{TopicPlan, client_config, prepare_topic};
use crate::lock;
use crate::payload::{PayloadKind, PayloadPool};
use crate::report::{LatencySummary, Sample, Session, Throughput, latency_histogram, micros_between};
use crate::roundtrip::SeqSet;

/// How long to send when neither `--records` nor `--duration` is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(30);

/// How long the final flush may wait for outstanding acknowledgements.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(120);

/// librdkafka's poll waits whole milliseconds: a shorter timeout becomes
/// 0, a poll that returns at once. A rate-limited send loop waiting less
/// than this sleeps instead, so it does not spin a core between records
/// (at 10,000 records/s every wait is 0.1 ms).
const MIN_POLL_WAIT: Duration = Duration::from_millis(1);

/// `wait` in whole milliseconds, as librdkafka's poll counts it.
fn whole_millis(wait: Duration) -> Duration {
    Duration::from_millis(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
}

/// A sleep ends up to the thread's timer slack late, 50 µs by default: half
/// of the 0.1 ms between records at 10,000 records/s (on this project's
/// VM a 0.1 ms sleep took 0.18 ms on average, 0.12 ms with a 1 µs slack).
/// `/proc/self/timerslack_ns` sets the main thread's slack, and threads
/// inherit the slack of the thread that starts them (proc(5), prctl(2)).
/// Best effort: where it cannot be written, sleeps are only later.
fn narrow_timer_slack() {
    let _ = std::fs::write("/proc/self/timerslack_ns", "1000");
}

/// Serves every delivery report already waiting. A poll without a timeout
/// serves one event at most, and with `linger.ms=0` there is one per
/// record: a loop polling once per record would fall behind for good.
fn serve_waiting(producer: &BaseProducer<DeliveryRecorder>) {
    loop {
        let served = producer.context().served();
        producer.poll(Duration::ZERO);
        if producer.context().served() == served {
            return;
        }
    }
}

/// `ketch-bench producer`
#[derive(clap::Args, Debug)]
pub struct ProducerCmd {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub produce: ProduceArgs,
    #[command(flatten)]
    pub common: crate::args::CommonArgs,
}

/// When producers stop.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    Records(u64),
    Duration(Duration),
}

impl Limit {
    /// How many records client `client` of `clients` sends, when counted.
    fn quota(self, client: u32, clients: usize) -> Option<u64> {
        let Limit::Records(total) = self else { return None };
        let clients = clients as u64;
        Some(total / clients + u64::from(u64::from(client) < total % clients))
    }

    fn deadline_ns(self) -> Option<u64> {
        let Limit::Duration(duration) = self else {
            return None;
        };
        Some(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Everything the producer threads need.
pub struct ProducerPlan {
    pub config: ClientConfig,
    pub topic: String,
    pub clients: usize,
    pub record_size: usize,
    pub limit: Limit,
    pub rate: Rate,
    pub payload: PayloadPool,
    pub run_id: u64,
    /// Keep the set of acknowledged sequences (the roundtrip needs it).
    pub track_acks: bool,
}

impl ProducerPlan {
    pub fn new(kafka: &KafkaArgs, produce: &ProduceArgs, topic: &str) -> anyhow::Result<Self> {
        let preset = kafka.workload.map(|w| w.preset());
        let clients = produce.clients.or(preset.map(|p| p.producers)).unwrap_or(1);
        let record_size = produce
            .record_size
            .or(preset.map(|p| p.record_size))
            .unwrap_or(1024);
        ensure!(clients > 0, "--clients must be at least 1");
        let limit = match (produce.records, produce.duration) {
            (Some(records), _) => Limit::Records(records),
            (None, duration) => Limit::Duration(duration.unwrap_or(DEFAULT_DURATION)),
        };
        Ok(ProducerPlan {
            config: client_config(kafka, &producer_settings(produce)),
            topic: topic.to_owned(),
            clients,
            record_size,
            limit,
            rate: produce.rate,
            payload: PayloadPool::new(produce.payload, record_size, produce.seed),
            run_id: rand::random(),
            track_acks: false,
        })
    }
}

fn producer_settings(produce: &ProduceArgs) -> Vec<(&'static str, String)> {
    let mut settings = vec![
        ("acks", produce.acks.as_config().to_owned()),
        ("compression.type", produce.compression.as_config().to_owned()),
        ("enable.idempotence", produce.idempotence.to_string()),
    ];
    settings.extend(produce.linger_ms.map(|ms| ("linger.ms", ms.to_string())));
    settings.extend(produce.batch_size.map(|bytes| ("batch.size", bytes.to_string())));
    settings
}

/// The effective producer parameters, as the result reports them.
#[derive(Serialize, Debug)]
pub struct ProducerParams {
    pub workload: Option<String>,
    pub bootstrap_server: String,
    pub topic: String,
    pub partitions: usize,
    pub clients: usize,
    pub record_size: usize,
    pub payload: PayloadKind,
    pub seed: u64,
    pub rate: Option<f64>,
    pub records: Option<u64>,
    pub duration_s: Option<f64>,
    /// Client settings as finally configured; `None` means the client's default.
    pub acks: Option<String>,
    pub compression: Option<String>,
    pub linger_ms: Option<String>,
    pub batch_size: Option<String>,
    pub idempotence: Option<String>,
}

impl ProducerParams {
    pub fn of(plan: &ProducerPlan, kafka: &KafkaArgs, produce: &ProduceArgs, partitions: usize) -> Self {
        let setting = |key: &str| plan.config.get(key).map(str::to_owned);
        ProducerParams {
            workload: kafka.workload.map(|w| w.name()),
            bootstrap_server: kafka.bootstrap_server.clone(),
            topic: plan.topic.clone(),
            partitions,
            clients: plan.clients,
            record_size: plan.record_size,
            payload: produce.payload,
            seed: produce.seed,
            rate: plan.rate.0,
            records: plan.limit.quota(0, 1),
            duration_s: plan.limit.deadline_ns().map(|ns| ns as f64 / 1e9),
            acks: setting("acks"),
            compression: setting("compression.type"),
            linger_ms: setting("linger.ms"),
            batch_size: setting("batch.size"),
            idempotence: setting("enable.idempotence"),
        }
    }
}

/// What one producer client saw, shared by its delivery callback and the progress line.
pub struct ClientStats {
    pub acked: u64,
    pub failed: u64,
    pub acked_bytes: u64,
    pub latency_us: Histogram<u64>,
    pub acked_sequences: SeqSet,
    pub first_error: Option<String>,
    /// When the last delivery report was served, in ns since the run's start.
    pub last_report_ns: u64,
}

impl ClientStats {
    fn new() -> Self {
        ClientStats {
            acked: 0,
            failed: 0,
            acked_bytes: 0,
            latency_us: latency_histogram(),
            acked_sequences: SeqSet::default(),
            first_error: None,
            last_report_ns: 0,
        }
    }
}

/// The delivery callback: runs on the client's own thread, inside `poll`.
struct DeliveryRecorder {
    start: Instant,
    stats: Arc<Mutex<ClientStats>>,
    track_acks: bool,
    /// Delivery reports served so far (records, acknowledged or failed).
    delivered: AtomicU64,
}

impl DeliveryRecorder {
    fn served(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

impl ClientContext for DeliveryRecorder {}

impl ProducerContext for DeliveryRecorder {
    /// The scheduled send time, in ns since the run's start.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, scheduled_ns: usize) {
        let acked_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let mut stats = lock(&self.stats);
        stats.last_report_ns = stats.last_report_ns.max(acked_ns);
        match result {
            Ok(message) => {
                let value = message.payload().unwrap_or_default();
                stats.acked += 1;
                stats.acked_bytes += value.len() as u64;
                stats
                    .latency_us
                    .saturating_record(micros_between(scheduled_ns as u64, acked_ns));
                if self.track_acks {
                    let envelope = Envelope::open(value).expect("our own records carry an envelope");
                    stats.acked_sequences.insert(envelope.sequence);
                }
            }
            Err((error, _)) => {
                stats.failed += 1;
                stats.first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
}

/// Producer threads at work.
pub struct ProducerRun {
    stats: Vec<Arc<Mutex<ClientStats>>>,
    threads: Vec<JoinHandle<anyhow::Result<()>>>,
}

/// All clients' figures together; `acked_sequences[i]` belongs to producer `i`.
pub struct ProducerTotals {
    pub acked: u64,
    pub failed: u64,
    pub acked_bytes: u64,
    pub latency_us: Histogram<u64>,
    pub acked_sequences: Vec<SeqSet>,
    pub first_error: Option<String>,
    /// From the run's start to the last delivery report any client served:
    /// the end of the run once every client has flushed.
    pub elapsed: Duration,
}

impl ProducerRun {
    /// Starts one thread per client; `start`/`start_epoch_ns` is the run's
    /// time zero. Call it on the main thread: a rate-limited run narrows
    /// the main thread's timer slack, which the client threads inherit.
    pub fn start(plan: Arc<ProducerPlan>, start: Instant, start_epoch_ns: u64) -> anyhow::Result<Self> {
        if plan.rate.0.is_some() {
            narrow_timer_slack();
        }
        let mut run = ProducerRun {
            stats: Vec::new(),
            threads: Vec::new(),
        };
        for id in 0..u32::try_from(plan.clients)? {
            let stats = Arc::new(Mutex::new(ClientStats::new()));
            let context = DeliveryRecorder {
                start,
                stats: Arc::clone(&stats),
                track_acks: plan.track_acks,
                delivered: AtomicU64::new(0),
            };
            let producer: BaseProducer<DeliveryRecorder> = plan
                .config
                .create_with_context(context)
                .context("creating a producer")?;
            let client = Client {
                plan: Arc::clone(&plan),
                id,
                start,
                start_epoch_ns,
            };
            let thread = std::thread::Builder::new().name(format!("producer-{id}"));
            run.threads.push(thread.spawn(move || client.run(&producer))?);
            run.stats.push(stats);
        }
        Ok(run)
    }

    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    pub fn sample(&self) -> Sample {
        let totals = self.totals();
        Sample {
            records: totals.acked,
            bytes: totals.acked_bytes,
            p99_us: (!totals.latency_us.is_empty()).then(|| totals.latency_us.value_at_quantile(0.99)),
        }
    }

    /// Waits for every client to flush, then adds their figures up.
    pub fn join(mut self) -> anyhow::Result<ProducerTotals> {
        for thread in std::mem::take(&mut self.threads) {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("a producer thread panicked"))??;
        }
        Ok(self.totals())
    }

    fn totals(&self) -> ProducerTotals {
        let mut totals = ProducerTotals {
            acked: 0,
            failed: 0,
            acked_bytes: 0,
            latency_us: latency_histogram(),
            acked_sequences: Vec::new(),
            first_error: None,
            elapsed: Duration::ZERO,
        };
        for stats in &self.stats {
            let stats = lock(stats);
            totals.acked += stats.acked;
            totals.failed += stats.failed;
            totals.acked_bytes += stats.acked_bytes;
            totals
                .latency_us
                .add(&stats.latency_us)
                .expect("histograms share bounds");
            totals.acked_sequences.push(stats.acked_sequences.clone());
            totals.first_error = totals.first_error.or_else(|| stats.first_error.clone());
            totals.elapsed = totals.elapsed.max(Duration::from_nanos(stats.last_report_ns));
        }
        totals
    }
}

/// One producer client's send loop.
struct Client {
    plan: Arc<ProducerPlan>,
    id: u32,
    start: Instant,
    start_epoch_ns: u64,
}

impl Client {
    fn run(self, producer: &BaseProducer<DeliveryRecorder>) -> anyhow::Result<()> {
        let plan = &*self.plan;
        let quota = plan.limit.quota(self.id, plan.clients);
        let deadline_ns = plan.limit.deadline_ns();
        let interval_ns = plan.rate.0.map(|rate| plan.clients as f64 * 1e9 / rate);
        let mut picker = plan.payload.picker(u64::from(self.id));
        let mut value = vec![0u8; plan.record_size];
        let mut sequence = 0u64;
        while quota.is_none_or(|quota| sequence < quota) {
            let scheduled_ns = interval_ns.map_or_else(|| self.now_ns(), |i| (sequence as f64 * i) as u64);
            if deadline_ns.is_some_and(|deadline| scheduled_ns >= deadline) {
                break;
            }
            self.wait_until(producer, scheduled_ns);
            value.copy_from_slice(picker.next_value());
            self.stamp(&mut value, sequence, scheduled_ns);
            send(
                producer,
                BaseRecord::with_opaque_to(&plan.topic, scheduled_ns as usize).payload(&value[..]),
            )?;
            if sequence.is_multiple_of(64) {
                producer.poll(Duration::ZERO);
            }
            sequence += 1;
        }
        flush(producer)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Serves delivery callbacks while early for the schedule: waits of a
    /// millisecond or more in librdkafka's poll, which serves callbacks as
    /// they come; shorter ones asleep, after serving those already waiting.
    fn wait_until(&self, producer: &BaseProducer<DeliveryRecorder>, scheduled_ns: u64) {
        // On time or late (always, without a rate), the record goes at once.
        while self.early_by(scheduled_ns).is_some() {
            serve_waiting(producer);
            let Some(wait) = self.early_by(scheduled_ns) else {
                return;
            };
            if wait >= MIN_POLL_WAIT {
                producer.poll(whole_millis(wait));
            } else {
                std::thread::sleep(wait);
            }
        }
    }

    /// How long before `scheduled_ns` it is now, if it is before.
    fn early_by(&self, scheduled_ns: u64) -> Option<Duration> {
        let now_ns = self.now_ns();
        (now_ns < scheduled_ns).then(|| Duration::from_nanos(scheduled_ns - now_ns))
    }

    /// Values large enough carry an envelope, so consumers can check them.
    fn stamp(&self, value: &mut [u8], sequence: u64, scheduled_ns: u64) {
        if value.len() >= ENVELOPE_LEN {
            let envelope = Envelope {
                run_id: self.plan.run_id,
                producer: self.id,
                sequence,
                send_time_ns: self.start_epoch_ns + scheduled_ns,
            };
            envelope.stamp(value);
        }
    }
}

/// Waits until every record sent has its delivery report.
///
/// Not rdkafka's `flush`: between its checks it polls for 100 ms, and its
/// poll returns only when the time is up, however soon the last report
/// came. A full-rate run's end fell up to 100 ms after its last
/// acknowledgement, in steps: a tenth of a 300,000-record preset.
fn flush(producer: &BaseProducer<DeliveryRecorder>) -> anyhow::Result<()> {
    let deadline = Instant::now() + FLUSH_TIMEOUT;
    loop {
        // librdkafka's flush with no wait: sends what lingers, and says
        // whether anything is still waiting for its report.
        match producer.flush(Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) if Instant::now() < deadline => {
                producer.poll(MIN_POLL_WAIT);
            }
            Err(error) => return Err(error).context("flushing the producer"),
        }
    }
}

/// Enqueues a record, waiting for room while the local queue is full.
fn send<'a>(
    producer: &BaseProducer<DeliveryRecorder>,
    mut record: BaseRecord<'a, (), [u8], usize>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                producer.poll(Duration::from_millis(10));
            }
            Err((error, _)) => return Err(error).context("enqueueing a record"),
        }
    }
}

/// Produce-side figures of a run.
#[derive(Serialize, Debug)]
pub struct ProduceFigures {
    pub throughput: Throughput,
    pub records_failed: u64,
    pub first_error: Option<String>,
    pub latency: LatencySummary,
}

impl ProduceFigures {
    pub fn of(totals: &ProducerTotals) -> Self {
        ProduceFigures {
            throughput: Throughput::new(totals.acked, totals.acked_bytes, totals.elapsed),
            records_failed: totals.failed,
            first_error: totals.first_error.clone(),
            latency: LatencySummary::of(&totals.latency_us),
        }
    }
}

/// `ketch-bench producer`: send, wait for every acknowledgement, report.
pub fn run(cmd: &ProducerCmd) -> anyhow::Result<Vec<String>> {
    let topic = TopicPlan::of(&cmd.kafka);
    let partitions = prepare_topic(&cmd.kafka, &topic)?;
    let plan = ProducerPlan::new(&cmd.kafka, &cmd.produce, &topic.name)?;
    let params = ProducerParams::of(&plan, &cmd.kafka, &cmd.produce, partitions.len());
    let mut session = Session::begin("producer", &cmd.common)?;
    let producers = ProducerRun::start(Arc::new(plan), session.start(), session.start_epoch_ns())?;
    session
        .progress
        .watch(|| producers.is_finished(), || producers.sample());
    let totals = producers.join()?;
    let figures = ProduceFigures::of(&totals);
    let mut failures = Vec::new();
    if totals.failed > 0 {
        failures.push(format!("{} records were not acknowledged", totals.failed));
    }
    session.finish(params, figures, totals.acked)?;
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_poll_in_whole_milliseconds() {
        assert_eq!(whole_millis(Duration::from_millis(1)), Duration::from_millis(1));
        assert_eq!(
            whole_millis(Duration::from_micros(1_700)),
            Duration::from_millis(1)
        );
        assert_eq!(whole_millis(Duration::from_secs(2)), Duration::from_secs(2));
        assert!(whole_millis(Duration::from_micros(999)) < MIN_POLL_WAIT);
    }
}

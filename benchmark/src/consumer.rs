//! The consuming side: rdkafka `BaseConsumer`s, one a thread, either with the
//! topic's partitions assigned directly (the default: no rebalance delay in
//! the figures) or subscribed through a group (`--group`). Throughput runs from the first
//! record received to the last.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use clap::ValueEnum;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Serialize;

use crate::args::{CommonArgs, KafkaArgs, parse_duration};
use crate::envelope::Envelope;
use crate::kafka::{TopicPlan, client_config, prepare_topic};
use crate::lock;
use crate::report::{Sample, Session, Throughput, epoch_ns};
use crate::roundtrip::Tracker;

/// How long a poll waits, which bounds how late a stop request is noticed.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// `ketch-bench consumer`
#[derive(clap::Args, Debug)]
pub struct ConsumerCmd {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Where reading starts.
    #[arg(long, value_enum, default_value_t = StartAt::Beginning)]
    pub from: StartAt,
    /// Subscribe through this consumer group instead of assigning every partition directly.
    #[arg(long)]
    pub group: Option<String>,
    /// Consumer instances, each on its own thread; partitions are split among them.
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Stop after this many records.
    #[arg(long)]
    pub records: Option<u64>,
    /// Stop after this long (e.g. 30s).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Stop when no record arrived for this long.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub idle_timeout: Duration,
    /// Check each value's envelope checksum (values written by ketch-bench).
    #[arg(long, value_enum)]
    pub validate: Option<Validate>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StartAt {
    Beginning,
    End,
}

#[derive(ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Validate {
    Checksum,
}

/// Everything the consumer threads need.
pub struct ConsumerPlan {
    pub config: ClientConfig,
    pub topic: String,
    pub partitions: Vec<i32>,
    pub start_at: StartAt,
    pub group: Option<String>,
    pub consumers: usize,
    pub validate: bool,
    /// Stop after this many records in total.
    pub records: Option<u64>,
}

/// Consumer settings: a throwaway group id unless a group is given, no commits.
pub fn consumer_config(kafka: &KafkaArgs, group: Option<&str>, start_at: StartAt) -> ClientConfig {
    let group_id = group.map_or_else(
        || format!("ketch-bench-{:016x}", rand::random::<u64>()),
        str::to_owned,
    );
    let reset = match start_at {
        StartAt::Beginning => "earliest",
        StartAt::End => "latest",
    };
    let settings = [
        ("group.id", group_id),
        ("enable.auto.commit", group.is_some().to_string()),
        ("enable.partition.eof", "false".to_owned()),
        ("auto.offset.reset", reset.to_owned()),
        // librdkafka stops fetching a partition for fetch.queue.backoff.ms
        // (1 s by default) once its local queue holds queued.min.messages
        // (100,000): at a million records a second one fetch does that, and
        // the pause, not the broker, would set the rate.
        ("fetch.queue.backoff.ms", "10".to_owned()),
    ];
    client_config(kafka, &settings)
}

/// What one consumer saw.
#[derive(Debug, Default, Clone)]
pub struct ConsumerStats {
    pub records: u64,
    pub bytes: u64,
    pub invalid: u64,
    pub errors: u64,
    pub first_at: Option<Instant>,
    pub last_at: Option<Instant>,
    pub first_problem: Option<String>,
}

impl ConsumerStats {
    fn observe(&mut self, value: &[u8], at: Instant, validate: bool) {
        self.records += 1;
        self.bytes += value.len() as u64;
        self.first_at.get_or_insert(at);
        self.last_at = Some(at);
        if validate && let Err(error) = Envelope::open(value) {
            self.invalid += 1;
            self.first_problem.get_or_insert_with(|| error.to_string());
        }
    }

    fn merge(&mut self, other: &ConsumerStats) {
        self.records += other.records;
        self.bytes += other.bytes;
        self.invalid += other.invalid;
        self.errors += other.errors;
        self.first_at = self.first_at.into_iter().chain(other.first_at).min();
        self.last_at = self.last_at.into_iter().chain(other.last_at).max();
        self.first_problem = self.first_problem.take().or_else(|| other.first_problem.clone());
    }

    /// Records and bytes over the time from the first record to the last.
    pub fn throughput(&self) -> Throughput {
        let span = self.first_at.zip(self.last_at).map(|(first, last)| last - first);
        Throughput::new(self.records, self.bytes, span.unwrap_or_default())
    }
}

/// Consumer threads at work.
pub struct ConsumerRun {
    stats: Vec<Arc<Mutex<ConsumerStats>>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl ConsumerRun {
    /// Creates and positions every consumer, then starts their threads; records
    /// produced after this returns are seen even when starting from the end.
    pub fn start(plan: &ConsumerPlan, tracker: Option<Arc<Mutex<Tracker>>>) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let consumed = Arc::new(AtomicU64::new(0));
        let mut run = ConsumerRun {
            stats: Vec::new(),
            threads: Vec::new(),
            stop: Arc::clone(&stop),
        };
        for index in 0..plan.consumers {
            let consumer = position(plan, index)?;
            let stats = Arc::new(Mutex::new(ConsumerStats::default()));
            let reader = Reader {
                consumer,
                stats: Arc::clone(&stats),
                tracker: tracker.clone(),
                stop: Arc::clone(&stop),
                consumed: Arc::clone(&consumed),
                limit: plan.records,
                validate: plan.validate,
            };
            let thread = std::thread::Builder::new().name(format!("consumer-{index}"));
            run.threads.push(thread.spawn(move || reader.run())?);
            run.stats.push(stats);
        }
        Ok(run)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    pub fn totals(&self) -> ConsumerStats {
        let mut totals = ConsumerStats::default();
        self.stats.iter().for_each(|stats| totals.merge(&lock(stats)));
        totals
    }

    pub fn sample(&self) -> Sample {
        let totals = self.totals();
        Sample {
            records: totals.records,
            bytes: totals.bytes,
            p99_us: None,
        }
    }

    pub fn join(mut self) -> anyhow::Result<ConsumerStats> {
        self.stop();
        for thread in std::mem::take(&mut self.threads) {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("a consumer thread panicked"))?;
        }
        Ok(self.totals())
    }
}

/// A consumer with its share of the partitions assigned (or its subscription made).
fn position(plan: &ConsumerPlan, index: usize) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = plan.config.create().context("creating a consumer")?;
    if plan.group.is_some() {
        consumer.subscribe(&[&plan.topic]).context("subscribing")?;
        return Ok(consumer);
    }
    let mut assignment = TopicPartitionList::new();
    for &partition in plan.partitions.iter().skip(index).step_by(plan.consumers) {
        let offset = match plan.start_at {
            StartAt::Beginning => Offset::Beginning,
            StartAt::End => Offset::Offset(high_watermark(&consumer, &plan.topic, partition)?),
        };
        assignment.add_partition_offset(&plan.topic, partition, offset)?;
    }
    consumer.assign(&assignment).context("assigning partitions")?;
    Ok(consumer)
}

/// A partition's high watermark. A request that fails is tried again for
/// a while, as `kafka::partitions_of` tries metadata: gateways that started
/// together may disagree on who leads it for up to a heartbeat.
fn high_watermark(consumer: &BaseConsumer, topic: &str, partition: i32) -> anyhow::Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match consumer.fetch_watermarks(topic, partition, Duration::from_secs(10)) {
            Ok((_, high)) => return Ok(high),
            Err(e) if Instant::now() >= deadline => {
                return Err(e).with_context(|| format!("the high watermark of {topic}/{partition}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// One consumer's poll loop.
struct Reader {
    consumer: BaseConsumer,
    stats: Arc<Mutex<ConsumerStats>>,
    tracker: Option<Arc<Mutex<Tracker>>>,
    stop: Arc<AtomicBool>,
    consumed: Arc<AtomicU64>,
    limit: Option<u64>,
    validate: bool,
}

impl Reader {
    fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            match self.consumer.poll(POLL_INTERVAL) {
                None => {}
                Some(Ok(message)) => self.receive(message.payload().unwrap_or_default()),
                Some(Err(error)) => {
                    let mut stats = lock(&self.stats);
                    stats.errors += 1;
                    stats.first_problem.get_or_insert_with(|| error.to_string());
                }
            }
        }
    }

    fn receive(&self, value: &[u8]) {
        lock(&self.stats).observe(value, Instant::now(), self.validate);
        if let Some(tracker) = &self.tracker {
            lock(tracker).receive(value, epoch_ns(SystemTime::now()));
        }
        let consumed = self.consumed.fetch_add(1, Ordering::Relaxed) + 1;
        if self.limit.is_some_and(|limit| consumed >= limit) {
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// The effective consumer parameters, as the result reports them.
#[derive(Serialize, Debug)]
struct ConsumerParams {
    workload: Option<String>,
    bootstrap_server: String,
    topic: String,
    partitions: usize,
    consumers: usize,
    from: StartAt,
    group: Option<String>,
    records: Option<u64>,
    duration_s: Option<f64>,
    idle_timeout_s: f64,
    validate: Option<Validate>,
    fetch_max_bytes: Option<String>,
}

#[derive(Serialize, Debug)]
struct ConsumeFigures {
    throughput: Throughput,
    invalid: Option<u64>,
    errors: u64,
    first_problem: Option<String>,
}

/// `ketch-bench consumer`: read until a limit, report.
pub fn run(cmd: &ConsumerCmd) -> anyhow::Result<Vec<String>> {
    let topic = TopicPlan::of(&cmd.kafka);
    let partitions = prepare_topic(&cmd.kafka, &topic)?;
    let plan = ConsumerPlan {
        config: consumer_config(&cmd.kafka, cmd.group.as_deref(), cmd.from),
        topic: topic.name,
        partitions,
        start_at: cmd.from,
        group: cmd.group.clone(),
        consumers: cmd.consumers.max(1),
        validate: cmd.validate.is_some(),
        records: cmd.records,
    };
    let params = params(cmd, &plan);
    let consumers = ConsumerRun::start(&plan, None)?;
    let mut session = Session::begin("consumer", &cmd.common)?;
    let start = session.start();
    let idle = || {
        let last = consumers.totals().last_at.unwrap_or(start);
        last.elapsed() >= cmd.idle_timeout
    };
    let out_of_time = || cmd.duration.is_some_and(|d| start.elapsed() >= d);
    session.progress.watch(
        || consumers.is_finished() || out_of_time() || idle(),
        || consumers.sample(),
    );
    let totals = consumers.join()?;
    let figures = ConsumeFigures {
        throughput: totals.throughput(),
        invalid: plan.validate.then_some(totals.invalid),
        errors: totals.errors,
        first_problem: totals.first_problem.clone(),
    };
    session.finish(params, figures, totals.records)?;
    let invalid = totals.invalid > 0;
    Ok(invalid
        .then(|| format!("{} records failed the checksum", totals.invalid))
        .into_iter()
        .collect())
}

fn params(cmd: &ConsumerCmd, plan: &ConsumerPlan) -> ConsumerParams {
    ConsumerParams {
        workload: cmd.kafka.workload.map(|w| w.name()),
        bootstrap_server: cmd.kafka.bootstrap_server.clone(),
        topic: plan.topic.clone(),
        partitions: plan.partitions.len(),
        consumers: plan.consumers,
        from: cmd.from,
        group: cmd.group.clone(),
        records: cmd.records,
        duration_s: cmd.duration.map(|d| d.as_secs_f64()),
        idle_timeout_s: cmd.idle_timeout.as_secs_f64(),
        validate: cmd.validate,
        fetch_max_bytes: plan.config.get("fetch.max.bytes").map(str::to_owned),
    }
}

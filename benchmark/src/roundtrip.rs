//! `ketch-bench roundtrip`: producers and consumers together on one topic.
//! Every value carries an [`Envelope`]; consumers match what they receive
//! against what producers saw acknowledged, so the run proves that nothing
//! acknowledged was lost, corrupted or duplicated, and measures end-to-end
//! latency from the (scheduled) send time to receipt.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::ensure;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::args::{CommonArgs, KafkaArgs, ProduceArgs, parse_duration};
use crate::consumer::{ConsumerPlan, ConsumerRun, StartAt, consumer_config};
use crate::envelope::{ENVELOPE_LEN, Envelope};
use crate::kafka::{TopicPlan, prepare_topic};
use crate::lock;
use crate::producer::{ProduceFigures, ProducerParams, ProducerPlan, ProducerRun, ProducerTotals};
use crate::report::{LatencySummary, Sample, Session, Throughput, latency_histogram, micros_between};

/// `ketch-bench roundtrip`
#[derive(clap::Args, Debug)]
pub struct RoundtripCmd {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub produce: ProduceArgs,
    /// Consumer instances, each on its own thread; partitions are split among
    /// them, assigned directly and read from the end.
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// After producers finish, how long consumers may take to receive every acknowledged record.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub drain_timeout: Duration,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A set of sequence numbers, one bit each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SeqSet {
    words: Vec<u64>,
    len: u64,
}

impl SeqSet {
    /// Adds `sequence`; false when it was already there.
    pub fn insert(&mut self, sequence: u64) -> bool {
        let (word, bit) = (
            usize::try_from(sequence / 64).expect("sequence fits memory"),
            sequence % 64,
        );
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let fresh = self.words[word] & (1 << bit) == 0;
        self.words[word] |= 1 << bit;
        self.len += u64::from(fresh);
        fresh
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// How many of these are not in `other`.
    pub fn count_missing_from(&self, other: Option<&SeqSet>) -> u64 {
        let others = other.map_or(&[][..], |o| &o.words[..]);
        let word_at = |i: usize| others.get(i).copied().unwrap_or(0);
        self.words
            .iter()
            .enumerate()
            .map(|(i, w)| u64::from((w & !word_at(i)).count_ones()))
            .sum()
    }
}

/// What consumers received of one run, checked envelope by envelope.
pub struct Tracker {
    run_id: u64,
    received: Vec<SeqSet>,
    bytes: u64,
    matched: u64,
    duplicates: u64,
    invalid: u64,
    foreign: u64,
    end_to_end_us: Histogram<u64>,
    first_invalid: Option<String>,
}

impl Tracker {
    pub fn new(run_id: u64, producers: usize) -> Self {
        Tracker {
            run_id,
            received: vec![SeqSet::default(); producers],
            bytes: 0,
            matched: 0,
            duplicates: 0,
            invalid: 0,
            foreign: 0,
            end_to_end_us: latency_histogram(),
            first_invalid: None,
        }
    }

    pub fn receive(&mut self, value: &[u8], received_ns: u64) {
        let envelope = match Envelope::open(value) {
            Ok(envelope) if envelope.run_id != self.run_id => return self.foreign += 1,
            Ok(envelope) => envelope,
            Err(error) => return self.reject(error.to_string()),
        };
        let Some(received) = self.received.get_mut(envelope.producer as usize) else {
            return self.reject(format!(
                "producer id {} is not one of this run's",
                envelope.producer
            ));
        };
        if received.insert(envelope.sequence) {
            self.matched += 1;
            self.bytes += value.len() as u64;
            self.end_to_end_us
                .saturating_record(micros_between(envelope.send_time_ns, received_ns));
        } else {
            self.duplicates += 1;
        }
    }

    fn reject(&mut self, why: String) {
        self.invalid += 1;
        self.first_invalid.get_or_insert(why);
    }

    /// Acknowledged sequences not received yet; `acked[i]` belongs to producer `i`.
    pub fn missing(&self, acked: &[SeqSet]) -> u64 {
        acked
            .iter()
            .enumerate()
            .map(|(i, set)| set.count_missing_from(self.received.get(i)))
            .sum()
    }

    fn sample(&self) -> Sample {
        let p99 = (!self.end_to_end_us.is_empty()).then(|| self.end_to_end_us.value_at_quantile(0.99));
        Sample {
            records: self.matched,
            bytes: self.bytes,
            p99_us: p99,
        }
    }
}

#[derive(Serialize, Debug)]
struct RoundtripParams {
    #[serde(flatten)]
    producer: ProducerParams,
    consumers: usize,
    drain_timeout_s: f64,
}

#[derive(Serialize, Debug)]
struct RoundtripFigures {
    produce: ProduceFigures,
    consume: Throughput,
    end_to_end_latency: LatencySummary,
    acked: u64,
    matched: u64,
    duplicates: u64,
    missing: u64,
    invalid: u64,
    foreign: u64,
    first_invalid: Option<String>,
    drain_s: f64,
}

/// `ketch-bench roundtrip`: produce and consume together, then account for every record.
pub fn run(cmd: &RoundtripCmd) -> anyhow::Result<Vec<String>> {
    let topic = TopicPlan::of(&cmd.kafka);
    let partitions = prepare_topic(&cmd.kafka, &topic)?;
    let mut plan = ProducerPlan::new(&cmd.kafka, &cmd.produce, &topic.name)?;
    ensure!(
        plan.record_size >= ENVELOPE_LEN,
        "roundtrip values start with a {ENVELOPE_LEN}-byte envelope; --record-size {} is too small",
        plan.record_size
    );
    plan.track_acks = true;
    let params = RoundtripParams {
        producer: ProducerParams::of(&plan, &cmd.kafka, &cmd.produce, partitions.len()),
        consumers: cmd.consumers.max(1),
        drain_timeout_s: cmd.drain_timeout.as_secs_f64(),
    };
    let tracker = Arc::new(Mutex::new(Tracker::new(plan.run_id, plan.clients)));
    let consumer_plan = ConsumerPlan {
        config: consumer_config(&cmd.kafka, None, StartAt::End),
        topic: topic.name,
        partitions,
        start_at: StartAt::End,
        group: None,
        consumers: params.consumers,
        validate: false,
        records: None,
    };
    let consumers = ConsumerRun::start(&consumer_plan, Some(Arc::clone(&tracker)))?;
    let mut session = Session::begin("roundtrip", &cmd.common)?;
    let producers = ProducerRun::start(Arc::new(plan), session.start(), session.start_epoch_ns())?;
    session
        .progress
        .watch(|| producers.is_finished(), || lock(&tracker).sample());
    let totals = producers.join()?;
    let drain_start = Instant::now();
    let drained = || lock(&tracker).missing(&totals.acked_sequences) == 0;
    session.progress.watch(
        || drained() || drain_start.elapsed() >= cmd.drain_timeout,
        || lock(&tracker).sample(),
    );
    let drain_s = drain_start.elapsed().as_secs_f64();
    let consumed = consumers.join()?;
    let figures = figures(&lock(&tracker), &totals, consumed.throughput(), drain_s);
    let failures = failures(&figures, cmd.drain_timeout);
    session.finish(params, figures, totals.acked)?;
    Ok(failures)
}

fn figures(
    tracker: &Tracker,
    totals: &ProducerTotals,
    consume: Throughput,
    drain_s: f64,
) -> RoundtripFigures {
    RoundtripFigures {
        produce: ProduceFigures::of(totals),
        consume,
        end_to_end_latency: LatencySummary::of(&tracker.end_to_end_us),
        acked: totals.acked_sequences.iter().map(SeqSet::len).sum(),
        matched: tracker.matched,
        duplicates: tracker.duplicates,
        missing: tracker.missing(&totals.acked_sequences),
        invalid: tracker.invalid,
        foreign: tracker.foreign,
        first_invalid: tracker.first_invalid.clone(),
        drain_s,
    }
}

fn failures(figures: &RoundtripFigures, drain_timeout: Duration) -> Vec<String> {
    let mut failures = Vec::new();
    if figures.missing > 0 {
        failures.push(format!(
            "{} acknowledged records were never received (drain timeout {:.1}s)",
            figures.missing,
            drain_timeout.as_secs_f64()
        ));
    }
    if figures.invalid > 0 {
        let why = figures.first_invalid.as_deref().unwrap_or("unknown");
        failures.push(format!(
            "{} records failed the envelope check; first: {why}",
            figures.invalid
        ));
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(run_id: u64, producer: u32, sequence: u64) -> Vec<u8> {
        let mut value = vec![7u8; 100];
        Envelope {
            run_id,
            producer,
            sequence,
            send_time_ns: 1_000_000,
        }
        .stamp(&mut value);
        value
    }

    #[test]
    fn seqset_reports_repeats() {
        let mut set = SeqSet::default();
        assert!(set.insert(5));
        assert!(set.insert(700));
        assert!(!set.insert(5));
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn missing_counts_acked_but_not_received() {
        let mut acked = SeqSet::default();
        let mut received = SeqSet::default();
        (0..200).for_each(|s| _ = acked.insert(s));
        (0..150).for_each(|s| _ = received.insert(s));
        assert_eq!(acked.count_missing_from(Some(&received)), 50);
        assert_eq!(acked.count_missing_from(None), 200);
        assert_eq!(received.count_missing_from(Some(&acked)), 0);
    }

    #[test]
    fn tracker_counts_matched_duplicate_foreign_and_invalid() {
        let mut tracker = Tracker::new(9, 2);
        tracker.receive(&value(9, 0, 0), 3_000_000);
        tracker.receive(&value(9, 1, 0), 3_000_000);
        tracker.receive(&value(9, 1, 0), 3_000_000);
        tracker.receive(&value(8, 0, 1), 3_000_000);
        tracker.receive(&value(9, 5, 0), 3_000_000);
        let mut corrupted = value(9, 0, 1);
        corrupted[60] ^= 1;
        tracker.receive(&corrupted, 3_000_000);
        let counts = (
            tracker.matched,
            tracker.duplicates,
            tracker.foreign,
            tracker.invalid,
        );
        assert_eq!(counts, (2, 1, 1, 2));
        assert_eq!(tracker.end_to_end_us.max(), 2000);
    }

    #[test]
    fn tracker_finds_what_producers_acked_but_nobody_received() {
        let mut tracker = Tracker::new(1, 1);
        tracker.receive(&value(1, 0, 0), 2_000_000);
        let mut acked = SeqSet::default();
        acked.insert(0);
        acked.insert(1);
        assert_eq!(tracker.missing(&[acked]), 1);
    }
}

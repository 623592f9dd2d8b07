//! A tailing fetch is answered from the batches its gateway just appended
//! (storage/src/tail.rs), not from Redis: the same bytes a read from Redis
//! returns, with several gateways appending to the partition, and nothing
//! below a log start that DeleteRecords moved.

use bytes::Bytes;
use kafka_protocol::messages::FetchRequest;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};

const BATCHES: usize = 40;
const RECORDS: i64 = 3;

/// The batch `n` of a run: three records, their values naming it.
fn nth_batch(n: usize) -> Vec<u8> {
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| Record::value(batch::at(i), format!("batch {n} record {i}").as_bytes()))
        .collect();
    batch::encode(&records)
}

/// A batch as a fetch returns it: its base offset patched in, partition
/// leader epoch 0 (as every read from Redis patches them).
fn as_fetched(mut batch: Vec<u8>, base_offset: i64) -> Bytes {
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
    batch[12..16].copy_from_slice(&0i32.to_be_bytes());
    Bytes::from(batch)
}

/// Tails partition 0 of `topic` through `consumer` (read_committed, as
/// librdkafka's consumers are by default) while `producers` take turns
/// appending one batch each: every fetch is sent before its batch is
/// produced, and waits for it. Asserts each fetch returns exactly the batch
/// produced, at its offset.
fn tail(consumer: &mut KafkaConn, producers: &mut [KafkaConn], topic: &str, first: usize) {
    for n in first..first + BATCHES {
        let offset = n as i64 * RECORDS;
        let mut request = raw::fetch_request(topic, 0, offset, 10_000);
        request.isolation_level = 1;
        consumer.send(raw::FETCH_VERSION, &request);
        let batch = nth_batch(n);
        let producer = &mut producers[n % producers.len()];
        assert_eq!(
            raw::produce(producer, topic, 0, batch.clone()),
            (code::NONE, offset)
        );
        let response = consumer.receive::<FetchRequest>(raw::FETCH_VERSION);
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, code::NONE, "fetch of batch {n}");
        assert!(partition.high_watermark >= offset + RECORDS);
        assert_eq!(partition.last_stable_offset, partition.high_watermark);
        let records = partition.records.clone().unwrap_or_default();
        assert_eq!(
            raw::split_batches(records),
            vec![as_fetched(batch, offset)],
            "fetch of batch {n} at offset {offset}"
        );
    }
}

fn start_topic(ketch: &Ketch) -> String {
    let topic = unique_topic("tail");
    let mut admin = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut admin, &topic, 1), code::NONE);
    topic
}

/// A topic on `ketch`, a consumer tailing it there and a producer, after
/// the first run of batches: its fetches subscribed to the partition's
/// channel, and the tail is kept from then on.
fn tailing(ketch: &Ketch) -> (String, KafkaConn, [KafkaConn; 1]) {
    let topic = start_topic(ketch);
    let mut consumer = KafkaConn::connect(ketch.kafka_addr());
    let mut producers = [KafkaConn::connect(ketch.kafka_addr())];
    tail(&mut consumer, &mut producers, &topic, 0);
    (topic, consumer, producers)
}

/// Redis `XRANGE` calls (every read of a partition's log) while `f` runs.
fn xranges_during(redis: &TestRedis, f: impl FnOnce()) -> u64 {
    let before = redis.command_calls("xrange");
    f();
    redis.command_calls("xrange") - before
}

#[test]
fn a_tailing_fetch_is_answered_without_reading_redis() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let (topic, mut consumer, mut producers) = tailing(&ketch);
    let reads = xranges_during(&redis, || tail(&mut consumer, &mut producers, &topic, BATCHES));
    assert!(
        reads <= 2,
        "{reads} reads of the log for {BATCHES} tailing fetches"
    );
    let (status, metrics) = ketch.http_get("/metrics");
    assert_eq!(status, 200);
    let tail_reads = metrics
        .lines()
        .filter(|l| l.starts_with("ketch_fetch_partition_reads_total{") && l.contains("source=\"tail\""))
        .find_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        tail_reads >= (BATCHES - 2) as f64,
        "{tail_reads} partition reads from the tail"
    );

    // Turned off, every tailing fetch reads Redis (this is what the
    // assertions above would see if the tail were not used).
    let off = Ketch::start(&redis.url(), &["--set", "fetch.tail_cache_bytes=0"]);
    let (topic, mut consumer, mut producers) = tailing(&off);
    let reads = xranges_during(&redis, || tail(&mut consumer, &mut producers, &topic, BATCHES));
    assert!(
        reads >= BATCHES as u64,
        "{reads} reads of the log for {BATCHES} tailing fetches without a tail"
    );
}

/// A partition no longer tailed keeps its channel subscribed for a while
/// (`fetch.subscription_linger`), and its tail what it held; the budget
/// still goes to the partition tailed now, its oldest batches giving way.
#[test]
fn a_tail_no_longer_read_gives_way_to_one_being_read() {
    let redis = TestRedis::start();
    // Room for about 25 of these batches.
    let ketch = Ketch::start(&redis.url(), &["--set", "fetch.tail_cache_bytes=4096"]);
    let (first, mut consumer, mut producers) = tailing(&ketch);
    let reads = xranges_during(&redis, || tail(&mut consumer, &mut producers, &first, BATCHES));
    assert!(
        reads <= 2,
        "{reads} reads of the log for {BATCHES} tailing fetches"
    );
    // The first topic's tail is full and nothing appends to it any more.
    let (second, mut consumer, mut producers) = tailing(&ketch);
    let reads = xranges_during(&redis, || tail(&mut consumer, &mut producers, &second, BATCHES));
    assert!(
        reads <= 2,
        "{reads} reads of the log for {BATCHES} tailing fetches of a second topic"
    );
}

/// Batches appended through another gateway are not in this one's tail:
/// the consumer gets them from Redis, and the tail's run starts again after
/// each, so every offset is served once, in order, with its own bytes.
#[test]
fn a_tail_holds_only_a_contiguous_run_of_its_gateways_batches() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &[]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    let topic = start_topic(&a);
    let mut consumer = KafkaConn::connect(a.kafka_addr());
    let mut producers = [
        KafkaConn::connect(a.kafka_addr()),
        KafkaConn::connect(b.kafka_addr()),
        KafkaConn::connect(a.kafka_addr()),
    ];
    tail(&mut consumer, &mut producers, &topic, 0);
    tail(&mut consumer, &mut producers, &topic, BATCHES);
}

/// After DeleteRecords moved the log start past batches still in the
/// gateway's tail, a fetch there is out of range, as Kafka answers it.
#[test]
fn a_tail_serves_nothing_below_the_log_start() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let (topic, mut consumer, _producers) = tailing(&ketch);
    let high_watermark = BATCHES as i64 * RECORDS;
    let below = high_watermark - RECORDS;
    // The last batch is in the tail.
    let reads = xranges_during(&redis, || {
        let response = consumer.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, below, 0));
        let (error, _, records) = raw::fetch_result(&response);
        assert_eq!(error, code::NONE);
        assert_eq!(records.as_deref().map_or(0, raw::count_records), RECORDS);
    });
    assert_eq!(reads, 0, "served from the tail");
    assert_eq!(
        raw::delete_records(&mut consumer, &topic, 0, high_watermark),
        (code::NONE, high_watermark)
    );
    let response = consumer.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, below, 0));
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::OFFSET_OUT_OF_RANGE);
    assert_eq!(partition.log_start_offset, high_watermark);
}

/// Polls `done` until it holds (10 s at most).
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The partitions `ketch` has read from Redis for fetches (its metrics,
/// which cost Redis nothing to ask).
fn redis_reads(ketch: &Ketch) -> f64 {
    let (status, metrics) = ketch.http_get("/metrics");
    assert_eq!(status, 200);
    metrics
        .lines()
        .filter(|l| l.starts_with("ketch_fetch_partition_reads_total{") && l.contains("source=\"redis\""))
        .find_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A fetch waiting for more bytes than one append brings (a large
/// `fetch.min.bytes`) on a partition another gateway appends to is woken
/// by each append, and reads only what it added: Redis sends about what
/// the fetch returns, not everything gathered since the fetch offset again
/// at every wake (about APPENDS²/2 batches).
#[test]
fn a_fetch_gathering_its_min_bytes_reads_each_append_once() {
    const APPENDS: usize = 40;
    let redis = TestRedis::start();
    let appending = Ketch::start(&redis.url(), &[]);
    let fetching = Ketch::start(&redis.url(), &[]);
    let topic = start_topic(&appending);
    let batch = batch::encode(&[Record::value(batch::at(0), &[b'v'; 4096])]);
    let mut producer = KafkaConn::connect(appending.kafka_addr());
    let mut consumer = KafkaConn::connect(fetching.kafka_addr());
    // Every batch is larger than its value: the last append completes it.
    let min_bytes = i32::try_from(APPENDS * 4096).expect("min bytes");
    let request = raw::fetch_request(&topic, 0, 0, 30_000).with_min_bytes(min_bytes);
    consumer.send(raw::FETCH_VERSION, &request);
    let channel = redis.partition_key(&topic, 0, "wake");
    until("the fetch's subscription", || {
        redis
            .shard_channels("*wake*")
            .get(&channel)
            .is_some_and(|n| *n > 0)
    });
    // From here on, the test asks Redis nothing until the fetch is answered.
    let sent_before = redis.sent_bytes();
    for n in 0..APPENDS {
        let reads = redis_reads(&fetching);
        assert_eq!(
            raw::produce(&mut producer, &topic, 0, batch.clone()),
            (code::NONE, n as i64)
        );
        // The fetch is woken and reads before the next append.
        if n + 1 < APPENDS {
            until("the woken fetch's read", || redis_reads(&fetching) > reads);
        }
    }
    let response = consumer.receive::<FetchRequest>(raw::FETCH_VERSION);
    let sent = redis.sent_bytes() - sent_before;
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::NONE);
    let expected: Vec<Bytes> = (0..APPENDS)
        .map(|n| as_fetched(batch.clone(), n as i64))
        .collect();
    assert_eq!(
        raw::split_batches(partition.records.clone().unwrap_or_default()),
        expected,
        "every append, once, in order"
    );
    let fetched = (APPENDS * batch.len()) as u64;
    assert!(
        sent < 2 * fetched,
        "Redis sent {sent} bytes for a fetch of {fetched}"
    );
}

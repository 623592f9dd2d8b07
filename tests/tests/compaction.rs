//! Log compaction (`cleanup.policy=compact`): the storage worker keeps the
//! latest record of each key with its offset, removes tombstones after
//! `delete.retention.ms`, keeps the open segment, re-encodes partly kept
//! batches in every codec, and readers — including one reading while a
//! pass runs, and through a gateway killed mid-pass — see one valid log:
//! increasing offsets, the latest value of every key that still exists.
//! Produce refuses records without a key (KIP-467 record errors).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::ProduceResponse;
use ketch_storage::batch::Records;
use ketch_tests::batch::{self, Codec, Record};
use ketch_tests::proxy::DelayProxy;
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, TestRedis, unique_topic};
use rdkafka::message::Message;

/// A gateway whose storage worker ticks every 50 ms.
fn gateway(redis: &TestRedis) -> Ketch {
    Ketch::start(&redis.url(), &["--set", "tiering.tick_interval=50ms"])
}

/// Creates a compacted topic of one partition whose segments are sealed
/// after 200 ms and compacted as soon as they are, with `configs`.
fn create_compacted(ketch: &Ketch, topic: &str, configs: &[(&str, &str)]) {
    let mut all: BTreeMap<&str, &str> = BTreeMap::from([
        ("cleanup.policy", "compact"),
        ("segment.ms", "200"),
        ("min.cleanable.dirty.ratio", "0"),
    ]);
    all.extend(configs.iter().copied());
    let all: Vec<(&str, &str)> = all.into_iter().collect();
    let rt = ketch_tests::runtime();
    ketch.create_topic_with(&rt, topic, 1, &all);
}

fn keyed(key: &str, value: Option<&str>) -> Record {
    Record {
        timestamp: now_ms(),
        key: Some(key.as_bytes().to_vec()),
        value: value.map(|v| v.as_bytes().to_vec()),
        headers: vec![("h".to_owned(), Some(key.as_bytes().to_vec()))],
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

fn meta(redis: &TestRedis, topic: &str, field: &str) -> i64 {
    let tag = &redis.topic_tags(topic)[0];
    let value: Option<i64> = redis::cmd("HGET")
        .arg(format!("ketch:{{{tag}}}:meta"))
        .arg(field)
        .query(&mut redis.connection())
        .expect("HGET meta");
    value.unwrap_or(0)
}

/// Waits until everything below `end` is compacted.
fn wait_compacted(redis: &TestRedis, ketch: &Ketch, topic: &str, end: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while meta(redis, topic, "clean_end") < end {
        assert!(
            Instant::now() < deadline,
            "not compacted up to {end}: clean_end {}; metrics:\n{}",
            meta(redis, topic, "clean_end"),
            ketch.http_get("/metrics").1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One record as a consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    offset: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
}

/// Every record of partition 0 from offset 0 to the high watermark, read
/// with raw fetches and decoded here (batch framing, codecs and offsets
/// checked); asserts offsets only increase.
fn read_all(ketch: &Ketch, topic: &str) -> Vec<Seen> {
    read_all_at(ketch.kafka_addr(), topic)
}

fn read_all_at(addr: std::net::SocketAddr, topic: &str) -> Vec<Seen> {
    read_log_at(addr, topic).0
}

/// [`read_all_at`]'s records, and how many control batches (transaction
/// markers) the log holds.
fn read_log_at(addr: std::net::SocketAddr, topic: &str) -> (Vec<Seen>, usize) {
    let mut conn = KafkaConn::connect(addr);
    let mut next = 0;
    let mut seen: Vec<Seen> = Vec::new();
    let mut markers = 0;
    loop {
        let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(topic, 0, next, 0));
        let (error, high_watermark, records) = raw::fetch_result(&response);
        assert_eq!(error, code::NONE, "fetch at {next}");
        if next >= high_watermark {
            return (seen, markers);
        }
        let batches = raw::split_batches(records.expect("records below the high watermark"));
        assert!(
            !batches.is_empty(),
            "an empty fetch at {next} below {high_watermark}"
        );
        for batch in batches {
            let base = i64::from_be_bytes(batch[0..8].try_into().unwrap());
            let last_delta = i32::from_be_bytes(batch[23..27].try_into().unwrap());
            let control = i16::from_be_bytes(batch[21..23].try_into().unwrap()) & 0x20 != 0;
            if control && base >= next {
                markers += 1;
            }
            let mut records = Records::of_batch(&batch).expect("a valid batch");
            while let Some(r) = records.next_record().expect("a valid record") {
                let offset = base + i64::from(r.offset_delta);
                if offset < next || control {
                    continue;
                }
                if let Some(previous) = seen.last() {
                    assert!(
                        offset > previous.offset,
                        "offset {offset} after {}",
                        previous.offset
                    );
                }
                seen.push(Seen {
                    offset,
                    key: r.key,
                    value: r.value,
                });
            }
            next = next.max(base + i64::from(last_delta) + 1);
        }
    }
}

/// The latest value (None: a tombstone) and offset of each key produced.
type Latest = BTreeMap<Bytes, (i64, Option<Bytes>)>;

/// Produces `batches` through `conn`; returns each key's latest offset and
/// value.
fn produce(
    conn: &mut KafkaConn,
    topic: &str,
    batches: &[Vec<Record>],
    codec: Option<Codec>,
    latest: &mut Latest,
) {
    for records in batches {
        let encoded = match codec {
            None => batch::encode(records),
            Some(codec) => batch::encode_compressed(records, codec, records.len() as i32),
        };
        let (error, base) = raw::produce(conn, topic, 0, encoded);
        assert_eq!(error, code::NONE);
        for (i, r) in records.iter().enumerate() {
            let key = Bytes::from(r.key.clone().expect("keyed"));
            latest.insert(key, (base + i as i64, r.value.clone().map(Bytes::from)));
        }
    }
}

/// The log a consumer must see once everything is compacted: each key's
/// latest record, at its offset; tombstones while they are kept.
fn expected(latest: &Latest, tombstones: bool) -> Vec<Seen> {
    let mut out: Vec<Seen> = latest
        .iter()
        .filter(|(_, (_, value))| tombstones || value.is_some())
        .map(|(key, (offset, value))| Seen {
            offset: *offset,
            key: Some(key.clone()),
            value: value.clone(),
        })
        .collect();
    out.sort_by_key(|s| s.offset);
    out
}

#[test]
fn a_compacted_topic_keeps_the_latest_record_of_each_key_and_drops_expired_tombstones() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compacted");
    create_compacted(&ketch, &topic, &[("delete.retention.ms", "3600000")]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    // Five versions of 40 keys, ten records a batch, each codec in turn;
    // then tombstones for keys 0–4.
    let codecs = [
        None,
        Some(Codec::Gzip),
        Some(Codec::Snappy),
        Some(Codec::Lz4),
        Some(Codec::Zstd),
    ];
    for (version, codec) in codecs.into_iter().enumerate() {
        let batches: Vec<Vec<Record>> = (0..4)
            .map(|b| {
                (0..10)
                    .map(|k| {
                        keyed(
                            &format!("key-{}", b * 10 + k),
                            Some(&format!("v{version}-{b}-{k}")),
                        )
                    })
                    .collect()
            })
            .collect();
        produce(&mut conn, &topic, &batches, codec, &mut latest);
    }
    let tombstones: Vec<Record> = (0..5).map(|k| keyed(&format!("key-{k}"), None)).collect();
    produce(&mut conn, &topic, &[tombstones], None, &mut latest);
    let end = redis.next_offset(&topic, 0);
    assert_eq!(end, 205);
    wait_compacted(&redis, &ketch, &topic, end);

    assert_eq!(read_all(&ketch, &topic), expected(&latest, true));
    assert!(
        redis.stream_len(&topic, 0) == 0,
        "the log below clean_end is trimmed"
    );
    // A real client reads the compacted batches (CRCs checked).
    let consumer = ketch.consumer_at(&topic, &[0], 0);
    let mut offsets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while offsets.len() < 40 {
        assert!(Instant::now() < deadline, "consumed {offsets:?}");
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            offsets.push(m.expect("a valid message").offset());
        }
    }
    let want: Vec<i64> = expected(&latest, true).iter().map(|s| s.offset).collect();
    assert_eq!(offsets, want);

    // Tombstones go once delete.retention.ms has passed (the next pass,
    // started by one more record).
    let (error, _) = raw::produce(
        &mut conn,
        &topic,
        0,
        batch::encode(&[keyed("key-zz", Some("after"))]),
    );
    assert_eq!(error, code::NONE);
    latest.insert(Bytes::from("key-zz"), (end, Some(Bytes::from("after"))));
    let answers = alter(&ketch, &topic, "delete.retention.ms", "0");
    assert_eq!(answers, 0);
    wait_compacted(&redis, &ketch, &topic, end + 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_all(&ketch, &topic) != expected(&latest, false) {
        assert!(
            Instant::now() < deadline,
            "tombstones stayed: {:?}",
            read_all(&ketch, &topic)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Compacted once, the topic cannot be archived, even under `delete`.
    assert_eq!(alter(&ketch, &topic, "cleanup.policy", "delete"), code::NONE);
    assert_eq!(
        alter(&ketch, &topic, "remote.storage.enable", "true"),
        code::INVALID_CONFIG
    );
}

/// A log whose last batch holds only records without a key (written while
/// the topic was `delete`) keeps that batch when compaction reaches the
/// end, as Kafka keeps the last batch of a cleaning round: the pass used to
/// drop it (it reads again only batches with a record that stays), and a
/// consumer then stopped below the high watermark, fetching nothing.
#[test]
fn a_log_ending_in_records_without_a_key_keeps_its_end_when_compacted() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-keyless-end");
    ketch.create_topic_with(
        &ketch_tests::runtime(),
        &topic,
        1,
        &[
            ("cleanup.policy", "delete"),
            ("segment.ms", "200"),
            ("min.cleanable.dirty.ratio", "0"),
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let keyless = Record {
        timestamp: now_ms(),
        key: None,
        value: Some(vec![b'v'; 1024]),
        headers: Vec::new(),
    };
    let first = batch::encode(&[keyed("a", Some("1"))]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, first).0, code::NONE);
    // More than one read of the pass (1 MiB) between the record that stays
    // and the end, so the end is not read with it.
    for _ in 0..12 {
        let records = vec![keyless.clone(); 100];
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&records)).0,
            code::NONE
        );
    }
    let end = 1 + 12 * 100;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !redis
        .segments(&topic, 0)
        .iter()
        .any(|s| s["last"].as_i64() == Some(end - 1))
    {
        assert!(Instant::now() < deadline, "the log was never sealed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(alter(&ketch, &topic, "cleanup.policy", "compact"), code::NONE);
    wait_compacted(&redis, &ketch, &topic, end);
    let offsets: Vec<i64> = read_all(&ketch, &topic).iter().map(|s| s.offset).collect();
    assert_eq!(offsets.first(), Some(&0));
    assert_eq!(offsets.last(), Some(&(end - 1)), "the end of the log");
}

/// The time index of a compacted topic shrinks with what compaction
/// removes: its log start never moves (no retention), and the index kept
/// an entry per few KiB ever appended, growing without bound while
/// compaction kept the data small. Timestamp lookups still find records.
#[test]
fn a_compacted_topics_time_index_shrinks_with_its_log() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-times");
    create_compacted(&ketch, &topic, &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let start = now_ms();
    let big = "v".repeat(8 * 1024);
    for i in 0..200 {
        let mut record = keyed("a", Some(&big));
        record.timestamp = start + i;
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&[record])).0,
            code::NONE
        );
    }
    let tag = &redis.topic_tags(&topic)[0];
    let entries = || -> i64 {
        redis::cmd("ZCARD")
            .arg(format!("ketch:{{{tag}}}:times"))
            .query(&mut redis.connection())
            .expect("ZCARD")
    };
    // An entry per batch of 8 KiB was appended; what compaction removed
    // leaves the index.
    wait_compacted(&redis, &ketch, &topic, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while entries() > 1 {
        assert!(
            Instant::now() < deadline,
            "the time index keeps {} entries",
            entries()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The one record left (offset 199) is found by its timestamp.
    assert_eq!(raw::list_offsets(&mut conn, &topic, 0, start).1, 199);
    assert_eq!(raw::list_offsets(&mut conn, &topic, 0, start + 199).1, 199);
}

/// Sets one topic config through IncrementalAlterConfigs; its error code.
fn alter(ketch: &Ketch, topic: &str, name: &str, value: &str) -> i16 {
    raw::set_topic_config(&mut KafkaConn::connect(ketch.kafka_addr()), topic, name, value)
}

/// Turns compaction on for a topic made with `cleanup.policy=delete` and
/// `delete.retention.ms=3000` once its segments up to `end` are sealed and
/// past delete.retention.ms, and waits for the pass: one pass compacts all
/// of it, by then old enough that its tombstones and markers could go.
fn compact_all_at_once(redis: &TestRedis, ketch: &Ketch, topic: &str, end: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !redis
        .segments(topic, 0)
        .iter()
        .any(|s| s["last"].as_i64() == Some(end - 1))
    {
        assert!(Instant::now() < deadline, "the last segment was never sealed");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(3_500));
    assert_eq!(alter(ketch, topic, "cleanup.policy", "compact"), code::NONE);
    wait_compacted(redis, ketch, topic, end);
}

/// A tombstone is kept delete.retention.ms from the pass that first
/// compacts it (the one that drops the value it deletes), however long ago
/// its segment was sealed: a consumer that read the value before that pass
/// still reads the tombstone after it (Kafka's delete horizon, KIP-534).
#[test]
fn a_tombstone_outlives_the_pass_that_drops_what_it_deletes() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("horizon");
    // Not compacted until the tombstone's segment is older than
    // delete.retention.ms.
    create_compacted(
        &ketch,
        &topic,
        &[("delete.retention.ms", "3000"), ("cleanup.policy", "delete")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    // (The log's last batch always stays: a record after the tombstone.)
    let batches = [
        vec![keyed("gone", Some("value")), keyed("kept", Some("value"))],
        vec![keyed("gone", None)],
        vec![keyed("later", Some("value"))],
    ];
    produce(&mut conn, &topic, &batches, None, &mut latest);
    let end = redis.next_offset(&topic, 0);
    compact_all_at_once(&redis, &ketch, &topic, end);
    assert_eq!(
        read_all(&ketch, &topic),
        expected(&latest, true),
        "the tombstone stays"
    );
    // A later pass, delete.retention.ms on, drops it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_all(&ketch, &topic) != expected(&latest, false) {
        assert!(Instant::now() < deadline, "the tombstone stayed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn records_without_a_key_are_refused_on_a_compacted_topic_with_record_errors() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("keyless");
    create_compacted(&ketch, &topic, &[("message.timestamp.after.max.ms", "3600000")]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let records = vec![
        keyed("a", Some("1")),
        Record::value(now_ms(), b"no key"),
        keyed("b", Some("2")),
        Record::value(now_ms(), b"no key either"),
    ];
    let response: ProduceResponse = conn.request(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&topic, 0, batch::encode(&records)),
    );
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, code::INVALID_RECORD);
    let indexes: Vec<i32> = partition.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(indexes, [1, 3]);
    let message = partition.record_errors[0]
        .batch_index_error_message
        .as_deref()
        .unwrap_or_default();
    assert!(
        message.starts_with("Compacted topic cannot accept message without key"),
        "{message}"
    );
    assert!(
        partition
            .error_message
            .as_deref()
            .is_some_and(|m| m.contains("2 record errors")),
        "{partition:?}"
    );
    assert_eq!(redis.next_offset(&topic, 0), 0, "nothing of the batch is stored");

    // Keys missing and timestamps out of bounds: each record names its key
    // error if it has one, else its timestamp's, and the batch is
    // INVALID_TIMESTAMP (Kafka's LogValidator).
    let ahead = now_ms() + 2 * 3_600_000;
    let mixed = vec![
        Record::value(now_ms(), b"no key"),
        Record {
            timestamp: ahead,
            ..keyed("c", Some("3"))
        },
        Record::value(ahead, b"no key, two hours ahead"),
    ];
    let response: ProduceResponse = conn.request(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&topic, 0, batch::encode(&mixed)),
    );
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, code::INVALID_TIMESTAMP);
    let errors: Vec<(i32, bool)> = partition
        .record_errors
        .iter()
        .map(|e| {
            let message = e.batch_index_error_message.as_deref().unwrap_or_default();
            (e.batch_index, message.starts_with("Compacted topic"))
        })
        .collect();
    assert_eq!(errors, [(0, true), (1, false), (2, true)]);
    assert_eq!(redis.next_offset(&topic, 0), 0, "nothing of the batch is stored");
    // The same batch is accepted once the topic no longer compacts.
    assert_eq!(alter(&ketch, &topic, "cleanup.policy", "delete"), 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while raw::produce(&mut conn, &topic, 0, batch::encode(&records)).0 != code::NONE {
        assert!(Instant::now() < deadline, "still refused");
    }
}

#[test]
fn compaction_under_concurrent_produce_and_consume_keeps_every_latest_value() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("busy");
    create_compacted(&ketch, &topic, &[("segment.ms", "100")]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A reader from offset 0, again and again, while the log is produced
    // and compacted: offsets always increase (read_all asserts it).
    let reader = {
        let (stop, addr, topic) = (stop.clone(), ketch.kafka_addr(), topic.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                read_all_at(addr, &topic);
                reads += 1;
            }
            reads
        })
    };
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let batch: Vec<Record> = (0..20)
            .map(|k| {
                keyed(
                    &format!("k{}", (round * 7 + k) % 50),
                    Some(&format!("r{round}-{k}")),
                )
            })
            .collect();
        produce(&mut conn, &topic, &[batch], Some(Codec::Lz4), &mut latest);
        round += 1;
    }
    let passes_during = metric(&ketch, "ketch_compaction_passes_total");
    let end = redis.next_offset(&topic, 0);
    wait_compacted(&redis, &ketch, &topic, end);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("the reader saw a valid log every time");
    assert!(reads > 0);
    assert!(
        passes_during >= 2.0,
        "compaction ran while producing: {passes_during} passes"
    );
    assert_eq!(read_all(&ketch, &topic), expected(&latest, true));
    println!("{round} batches, {passes_during} passes while producing, {reads} full reads");
}

/// A counter's value from `/metrics`.
fn metric(ketch: &Ketch, name: &str) -> f64 {
    let (_, body) = ketch.http_get("/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// A gateway SIGKILLed while its compaction pass writes the new compacted
/// stream: its replies from Redis are held back 20 ms each (a proxy), so
/// the pass is slow enough to be caught in the act. Another gateway then
/// compacts the partition, and the log is the compacted one, nothing lost.
/// Single Redis only: the proxy cannot sit in front of a cluster.
#[test]
fn a_gateway_killed_mid_compaction_leaves_a_log_the_next_one_compacts() {
    let redis = RedisServer::start();
    let topic = unique_topic("killed");
    let mut latest = Latest::new();
    {
        // Produced directly: 40,000 records of 1 KiB over 20,000 keys, in
        // one segment (sealed only later).
        let producing = Ketch::start(&redis.url(), &[]);
        create_compacted(&producing, &topic, &[("segment.ms", "3600000")]);
        let mut conn = KafkaConn::connect(producing.kafka_addr());
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = move || {
            (0..1000)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    char::from(b'a' + (state % 26) as u8)
                })
                .collect::<String>()
        };
        for b in 0..400 {
            let records: Vec<Record> = (0..100)
                .map(|k| {
                    keyed(
                        &format!("key-{}", (b * 100 + k) % 20_000),
                        Some(&format!("{b}-{k}-{}", noise())),
                    )
                })
                .collect();
            produce(&mut conn, &topic, &[records], Some(Codec::Zstd), &mut latest);
        }
    }
    let end = redis.next_offset(&topic, 0);
    let proxy = DelayProxy::start(([127, 0, 0, 1], redis.port()).into(), Duration::from_millis(20));
    let mut slow = Ketch::start(
        &proxy.redis_url(),
        &[
            "--set",
            "tiering.tick_interval=50ms",
            "--set",
            "tiering.lease_ttl=2s",
        ],
    );
    assert_eq!(alter(&slow, &topic, "segment.ms", "1"), 0);
    let tag = redis.topic_tags(&topic)[0].clone();
    let compacting = format!("ketch:{{{tag}}}:compacting");
    let clean_end = |redis: &RedisServer| -> i64 {
        let value: Option<i64> = redis::cmd("HGET")
            .arg(format!("ketch:{{{tag}}}:meta"))
            .arg("clean_end")
            .query(&mut redis.connection())
            .expect("HGET");
        value.unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&compacting)
            .query(&mut redis.connection())
            .expect("EXISTS");
        if exists == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no compaction pass started");
        assert_eq!(clean_end(&redis), 0, "the pass ended unseen");
        std::thread::sleep(Duration::from_millis(2));
    }
    slow.kill9();
    println!("killed with clean_end {}", clean_end(&redis));

    let next = Ketch::start(&redis.url(), &["--set", "tiering.tick_interval=50ms"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while clean_end(&redis) < end {
        assert!(Instant::now() < deadline, "the next gateway did not compact");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(read_all(&next, &topic), expected(&latest, true));
    let leftover: i64 = redis::cmd("EXISTS")
        .arg(&compacting)
        .query(&mut redis.connection())
        .expect("EXISTS");
    assert_eq!(leftover, 0, "the killed pass's stream is gone");
    assert_eq!(
        redis.stream_len(&topic, 0),
        0,
        "the log below clean_end is trimmed"
    );
}

/// A Kafka Streams-style changelog: a transactional producer's committed
/// and aborted transactions on a compacted topic. Compaction removes the
/// aborted records and superseded committed ones, so read_committed and
/// read_uncommitted consumers both see the latest committed value of every
/// key, and the markers of transactions that have no record left once they
/// are older than delete.retention.ms.
#[test]
fn compaction_drops_aborted_transactions_and_keeps_committed_values() {
    use rdkafka::producer::{FutureRecord, Producer};

    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("changelog");
    // Not compacted until every transaction is written, so that one pass
    // drops every aborted transaction's records.
    create_compacted(
        &ketch,
        &topic,
        &[("delete.retention.ms", "3000"), ("cleanup.policy", "delete")],
    );
    let rt = ketch_tests::runtime();
    let producer = ketch.producer_with(&[("transactional.id", &unique_topic("txn"))]);
    producer.init_transactions(Duration::from_secs(30)).expect("init");
    let send = |key: String, value: String| {
        producer
            .send_result(FutureRecord::to(&topic).key(&key).payload(&value).partition(0))
            .map_err(|(e, _)| e)
            .expect("queued")
    };
    for round in 0..3 {
        producer.begin_transaction().unwrap();
        let sent: Vec<_> = (0..20)
            .map(|k| send(format!("k{k}"), format!("committed-{round}")))
            .collect();
        producer
            .commit_transaction(Duration::from_secs(30))
            .expect("commit");
        for delivery in sent {
            rt.block_on(delivery).unwrap().map_err(|(e, _)| e).unwrap();
        }
        producer.begin_transaction().unwrap();
        let sent: Vec<_> = (0..20)
            .map(|k| send(format!("k{k}"), format!("aborted-{round}")))
            .collect();
        producer.flush(Duration::from_secs(30)).unwrap();
        producer
            .abort_transaction(Duration::from_secs(30))
            .expect("abort");
        for delivery in sent {
            let _ = rt.block_on(delivery);
        }
    }
    let end = redis.next_offset(&topic, 0);
    let (records, markers) = read_log_at(ketch.kafka_addr(), &topic);
    assert_eq!((records.len(), markers), (120, 6), "before compaction");
    compact_all_at_once(&redis, &ketch, &topic, end);
    // The pass that dropped the aborted transactions' records kept every
    // marker and the index entries (a read_committed reader that read
    // those records before the pass still finds them aborted), for
    // delete.retention.ms from the pass, as Kafka's delete horizon.
    let (records, markers) = read_log_at(ketch.kafka_addr(), &topic);
    assert_eq!((records.len(), markers), (20, 6));
    let tag = &redis.topic_tags(&topic)[0];
    let indexed = || -> i64 {
        redis::cmd("ZCARD")
            .arg(format!("ketch:{{{tag}}}:aborted"))
            .query(&mut redis.connection())
            .expect("ZCARD")
    };
    assert_eq!(indexed(), 3);
    // A later pass, delete.retention.ms on, drops them but the last
    // abort's, the end of the log, which stays so that a reader there
    // moves to the end (read_log_at asserts no fetch below the high
    // watermark is empty).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (records, markers) = read_log_at(ketch.kafka_addr(), &topic);
        assert_eq!(records.len(), 20, "the records of the last commit");
        if markers == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{markers} markers left");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The aborted transactions index forgot those whose markers went (a
    // read_committed reader would otherwise wait for their markers and
    // skip the producer's later records): the last abort's is left.
    assert_eq!(indexed(), 1);
    for isolation in ["read_committed", "read_uncommitted"] {
        let consumer = ketch.consumer_with(&[("isolation.level", isolation)]);
        let mut assignment = rdkafka::TopicPartitionList::new();
        assignment
            .add_partition_offset(&topic, 0, rdkafka::Offset::Offset(0))
            .unwrap();
        rdkafka::consumer::Consumer::assign(&consumer, &assignment).unwrap();
        let mut values = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while values.len() < 20 {
            assert!(Instant::now() < deadline, "{isolation}: {values:?}");
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                let m = m.expect("a valid message");
                let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
                let value = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
                assert!(values.insert(key, value).is_none(), "{isolation}: a key twice");
            }
        }
        assert!(
            values.values().all(|v| v == "committed-2"),
            "{isolation}: {values:?}"
        );
    }
    // Only the last committed round's records remain, besides markers.
    let records = read_all(&ketch, &topic);
    assert_eq!(records.len(), 20);
    assert!(
        records
            .iter()
            .all(|r| r.value.as_deref() == Some(&b"committed-2"[..]))
    );
}

/// ListOffsets -3 (KIP-734) after compaction removed the record with the
/// largest timestamp: the largest timestamp still in the log answers, as
/// Kafka's cleaner recomputes a segment's max timestamp from what it kept.
#[test]
fn the_max_timestamp_is_what_compaction_kept() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-max-ts");
    create_compacted(&ketch, &topic, &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let base = now_ms();
    let at = |key: &str, timestamp: i64| Record {
        timestamp,
        ..keyed(key, Some("v"))
    };
    // Offset 0 holds the largest timestamp; offset 1 replaces its key.
    for record in [
        at("k1", base + 5_000),
        at("k1", base + 4_000),
        at("k2", base + 1_000),
    ] {
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&[record])).0,
            code::NONE
        );
    }
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, -3),
        (code::NONE, 0, base + 5_000)
    );
    wait_compacted(&redis, &ketch, &topic, 3);
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, -3),
        (code::NONE, 1, base + 4_000),
        "the largest timestamp left"
    );
}

/// A compacted segment's largest timestamp is what it kept, as Kafka's
/// cleaner computes it: with `cleanup.policy=compact,delete`, a segment
/// whose newest record a later one of its key superseded is deleted once
/// what it kept is past `retention.ms`, not only once the record it lost
/// would have been.
#[test]
fn time_retention_ages_a_compacted_segment_by_what_it_kept() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-retention");
    create_compacted(
        &ketch,
        &topic,
        &[("cleanup.policy", "compact,delete"), ("retention.ms", "3600000")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let old = now_ms() - 2 * 3_600_000;
    let at = |key: &str, timestamp: i64| Record {
        timestamp,
        ..keyed(key, Some("v"))
    };
    // One batch, so one segment: its newest record (offset 0) is replaced
    // by an older one of its key. A second batch follows: the log's last
    // batch is kept whole.
    let records = [at("k1", now_ms()), at("k1", old), at("k2", old)];
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch::encode(&records)),
        (code::NONE, 0)
    );
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch::encode(&[at("k3", old)])),
        (code::NONE, 3)
    );
    wait_compacted(&redis, &ketch, &topic, 4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while meta(&redis, &topic, "log_start") < 3 {
        assert!(
            Instant::now() < deadline,
            "the compacted segment was never deleted: log start {}, segments {:?}",
            meta(&redis, &topic, "log_start"),
            redis.segments(&topic, 0)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (error, earliest, _) = raw::list_offsets(&mut conn, &topic, 0, -2);
    assert_eq!(error, code::NONE);
    assert!(earliest >= 3, "a consumer's earliest offset is {earliest}");
}

/// `max.compaction.lag.ms` counts from the oldest first batch of the dirty
/// segments, as Kafka's cleaner counts it, not from their newest record: a
/// segment whose first record is past the lag is compacted though its newest
/// is not (and the dirty ratio alone, at 1.0, starts no pass).
#[test]
fn the_compaction_lag_counts_from_the_first_batch() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-first-batch");
    create_compacted(
        &ketch,
        &topic,
        &[
            ("min.cleanable.dirty.ratio", "1"),
            ("max.compaction.lag.ms", "60000"),
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let old = Record {
        timestamp: now_ms() - 3_600_000,
        ..keyed("k1", Some("old"))
    };
    for record in [old, keyed("k1", Some("new")), keyed("k2", Some("v"))] {
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&[record])).0,
            code::NONE
        );
    }
    wait_compacted(&redis, &ketch, &topic, 3);
    let values: Vec<Option<Bytes>> = read_all(&ketch, &topic).into_iter().map(|s| s.value).collect();
    assert_eq!(
        values,
        [Some(Bytes::from_static(b"new")), Some(Bytes::from_static(b"v"))]
    );
}

/// A batch whose last records compaction drops keeps its last offset (its
/// last offset delta), as Kafka's log cleaner keeps it: a consumer moves
/// past the whole batch, and its last sequence stays the producer's.
#[test]
fn a_batch_whose_last_records_go_keeps_its_last_offset() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-last-offset");
    create_compacted(&ketch, &topic, &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    // Offsets 0–2 in one batch; 3 and 4 replace its last two records.
    for records in [
        vec![
            keyed("a", Some("1")),
            keyed("b", Some("1")),
            keyed("c", Some("1")),
        ],
        vec![keyed("b", Some("2")), keyed("c", Some("2"))],
    ] {
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&records)).0,
            code::NONE
        );
    }
    wait_compacted(&redis, &ketch, &topic, 5);
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 0));
    let (error, _, records) = raw::fetch_result(&response);
    assert_eq!(error, code::NONE);
    let first = raw::split_batches(records.expect("records"))[0].clone();
    let header = ketch_storage::batch::header(&first).expect("a batch");
    assert_eq!(
        (header.record_count, header.last_offset_delta),
        (1, 2),
        "one record kept of three, the batch's last offset 2"
    );
    assert_eq!(read_all(&ketch, &topic).len(), 3, "a@0, b@3, c@4");
}

/// A compaction pass is fenced by a token of its own, beside the lease: a
/// worker that lost the lease does not remove the holder's stream when it
/// tries to swap its own pass in (it used to: the holder then swapped in
/// what was left of its pass, and the log lost those records), and a
/// worker that got the lease back after another started over cannot go on
/// writing its old pass after the other's start (the stream would hold the
/// other's start and this pass's end). The scripts, run as the gateways run
/// them.
#[test]
fn a_compaction_pass_is_fenced_by_its_token_as_well_as_the_lease() {
    let redis = TestRedis::start();
    let mut r = redis.connection();
    let (lease, compacting, meta, clean, segments, aborted) = (
        "ketch:{t}:lease",
        "ketch:{t}:compacting",
        "ketch:{t}:meta",
        "ketch:{t}:clean",
        "ketch:{t}:segments",
        "ketch:{t}:aborted",
    );
    let add_script = redis::Script::new(include_str!("../../storage/src/scripts/compact_add.lua"));
    let add = |r: &mut ketch_tests::TestConnection, worker: &str, pass: &str, entries: &[&str]| -> i64 {
        let mut call = add_script.prepare_invoke();
        call.key(lease).key(compacting).key(meta).arg(worker).arg(pass);
        for id in entries {
            call.arg(*id).arg("batch");
        }
        call.invoke(r).expect("compact_add")
    };
    let swap = |r: &mut ketch_tests::TestConnection, worker: &str, pass: &str| -> i64 {
        redis::Script::new(include_str!("../../storage/src/scripts/compact_swap.lua"))
            .key(meta)
            .key(lease)
            .key(compacting)
            .key(clean)
            .key(segments)
            .key(aborted)
            .arg(format!("{worker} {pass}"))
            .arg("")
            .arg(10)
            .arg(100)
            .arg("")
            .arg(0)
            .invoke(r)
            .expect("compact_swap")
    };
    let set = |r: &mut ketch_tests::TestConnection, key: &str, value: &str| {
        let () = redis::cmd("SET").arg(key).arg(value).query(r).expect("SET");
    };
    let len = |r: &mut ketch_tests::TestConnection| -> i64 {
        redis::cmd("XLEN").arg(compacting).query(r).expect("XLEN")
    };
    let () = redis::cmd("HSET")
        .arg(meta)
        .arg("next_offset")
        .arg(10)
        .arg("log_start")
        .arg(0)
        .query(&mut r)
        .expect("HSET");

    // A starts a pass and writes a chunk; the lease passes to B, which
    // starts over and writes one; A gets the lease back.
    set(&mut r, lease, "A");
    assert_eq!(add(&mut r, "A", "a1", &[]), 1);
    assert_eq!(add(&mut r, "A", "a1", &["0-1"]), 1);
    set(&mut r, lease, "B");
    assert_eq!(add(&mut r, "A", "a1", &["1-1"]), 0, "A without the lease");
    assert_eq!(add(&mut r, "B", "b1", &[]), 1);
    assert_eq!(add(&mut r, "B", "b1", &["0-1"]), 1);
    set(&mut r, lease, "A");
    assert_eq!(
        add(&mut r, "A", "a1", &["5-1"]),
        0,
        "A's old pass after B started over"
    );
    assert_eq!(swap(&mut r, "A", "a1"), 0, "A's old pass swapped in");
    assert_eq!(len(&mut r), 1, "B's stream was changed");
    // B lost the lease to A: its swap leaves the stream to A's new pass.
    assert_eq!(add(&mut r, "A", "a2", &[]), 1);
    assert_eq!(add(&mut r, "A", "a2", &["0-1", "1-1"]), 1);
    assert_eq!(swap(&mut r, "B", "b1"), 0, "B's pass without the lease");
    assert_eq!(len(&mut r), 2, "the holder's pass was removed by another's swap");
    assert_eq!(swap(&mut r, "A", "a2"), 1, "the holder's current pass");
    let clean_end: String = redis::cmd("HGET")
        .arg(meta)
        .arg("clean_end")
        .query(&mut r)
        .expect("HGET");
    assert_eq!(clean_end, "10");
    let swapped: i64 = redis::cmd("XLEN").arg(clean).query(&mut r).expect("XLEN");
    assert_eq!(swapped, 2);
}

/// A worker that does not hold a partition's lease (it lost it to another
/// gateway mid-tick) leaves the pass the holder is writing alone: it used
/// to remove the holder's `compacting` stream before it looked at the
/// lease, and the holder then swapped in what was left of its pass,
/// losing every compacted record written before.
#[test]
fn a_worker_without_the_lease_leaves_the_holders_pass_alone() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-not-holder");
    // Sealed, never compacted by the gateway (a long compaction lag).
    create_compacted(&ketch, &topic, &[("min.compaction.lag.ms", "3600000")]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    produce(
        &mut conn,
        &topic,
        &[vec![keyed("a", Some("1"))], vec![keyed("a", Some("2"))]],
        None,
        &mut latest,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while redis.segments(&topic, 0).is_empty() {
        assert!(Instant::now() < deadline, "no segment sealed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The holder's pass so far.
    let tag = &redis.topic_tags(&topic)[0];
    let compacting = format!("ketch:{{{tag}}}:compacting");
    let _: String = redis::cmd("XADD")
        .arg(&compacting)
        .arg("0-1")
        .arg("b")
        .arg("the holder's pass")
        .query(&mut redis.connection())
        .expect("XADD");

    let config = ketch_tests::store_config(&redis.url());
    let outcome = ketch_tests::runtime().block_on(async {
        let store = ketch_storage::Store::new(&config).expect("store");
        let topic = store.topic(&topic).await.expect("topic").expect("exists");
        let policy = ketch_storage::compact::CompactPolicy {
            min_dirty_ratio: 0.0,
            min_lag_ms: 0,
            max_lag_ms: i64::MAX,
            delete_retention_ms: 86_400_000,
            max_keys: 100_000,
        };
        store
            .compact(&topic, 0, "not-the-holder", &policy)
            .await
            .expect("compact")
    });
    assert!(outcome.is_none(), "a pass without the lease: {outcome:?}");
    let left: i64 = redis::cmd("XLEN")
        .arg(&compacting)
        .query(&mut redis.connection())
        .expect("XLEN");
    assert_eq!(left, 1, "the holder's pass was removed");
    assert_eq!(meta(&redis, &topic, "clean_end"), 0);
}

/// Remote storage turned on while a first compaction pass runs: the pass
/// is given up instead of swapping in and trimming the log the archiver
/// reads (archiving then failed on every tick, and retention waited for
/// it for ever), and the segments are archived; a pass cut short earlier
/// does not stand in the way either. The pass runs in-process
/// through a proxy that holds it at a chosen step; the gateway, which
/// answers AlterConfigs and archives, is kept off the partition by the
/// pass's lease until the end.
#[test]
fn remote_storage_turned_on_during_a_first_compaction_pass_is_archived() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    let data = format!("tiering.data_dir={}", dir.path().display());
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "tiering.tick_interval=50ms", "--set", &data],
    );
    let proxy = DelayProxy::start(([127, 0, 0, 1], redis.port()).into(), Duration::ZERO);
    let config = ketch_tests::store_config(&proxy.redis_url());
    let rt = ketch_tests::runtime();
    let store = {
        let _entered = rt.enter();
        std::sync::Arc::new(ketch_storage::Store::new(&config).expect("store"))
    };
    let policy = ketch_storage::compact::CompactPolicy {
        min_dirty_ratio: 0.0,
        min_lag_ms: 0,
        max_lag_ms: i64::MAX,
        delete_retention_ms: 86_400_000,
        max_keys: 100_000,
    };
    let hget = |key: &str, field: &str| -> Option<String> {
        redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query(&mut redis.connection())
            .expect("HGET")
    };
    // A pass by the worker "test-pass", which takes the partition's lease,
    // held at its `held`-th write to the stream it builds (0: its start;
    // the scripts loaded in Redis before, so each write is one request).
    let pass = |topic: &str, held: usize| {
        let tag = redis.topic_tags(topic)[0].clone();
        let () = redis::cmd("SET")
            .arg(format!("ketch:{{{tag}}}:lease"))
            .arg("test-pass")
            .arg("PX")
            .arg(120_000)
            .query(&mut redis.connection())
            .expect("SET lease");
        proxy.hold_requests(b"}:compacting", held);
        let (store, name) = (store.clone(), topic.to_owned());
        let handle = rt.handle().clone();
        let running = std::thread::spawn(move || {
            handle.block_on(async {
                let topic = store.topic(&name).await.expect("topic").expect("exists");
                store
                    .compact(&topic, 0, "test-pass", &policy)
                    .await
                    .expect("compact")
            })
        });
        if held != usize::MAX {
            assert!(
                proxy.await_held(Duration::from_secs(20)),
                "the pass never got there"
            );
        }
        (tag, running)
    };
    let sealed_topic = |prefix: &str| {
        let topic = unique_topic(prefix);
        // Never compacted by the gateway (a long compaction lag).
        create_compacted(&ketch, &topic, &[("min.compaction.lag.ms", "3600000")]);
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        let mut latest = Latest::new();
        let batches = [vec![keyed("a", Some("1"))], vec![keyed("a", Some("2"))]];
        produce(&mut conn, &topic, &batches, None, &mut latest);
        let deadline = Instant::now() + Duration::from_secs(20);
        while redis.segments(&topic, 0).is_empty() {
            assert!(Instant::now() < deadline, "no segment sealed");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(alter(&ketch, &topic, "cleanup.policy", "delete"), code::NONE);
        topic
    };

    // A first pass, unheld, loads the scripts.
    let topic = sealed_topic("remote-warm-up");
    let (_, running) = pass(&topic, usize::MAX);
    assert!(running.join().expect("the pass").is_some(), "swapped in");

    // The pass changed nothing, left nothing behind, and the gateway
    // archives the sealed segment once it gets the lease.
    let given_up = |topic: &str, tag: &str, running: std::thread::JoinHandle<Option<_>>| {
        let meta = format!("ketch:{{{tag}}}:meta");
        assert!(running.join().expect("the pass").is_none(), "the pass gave up");
        assert_eq!(hget(&meta, "clean_end"), None, "nothing swapped in");
        assert_eq!(hget(&meta, "compacting_pass"), None);
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("ketch:{{{tag}}}:compacting"))
            .query(&mut redis.connection())
            .expect("EXISTS");
        assert_eq!(exists, 0, "the pass's stream is removed");
        let () = redis::cmd("DEL")
            .arg(format!("ketch:{{{tag}}}:lease"))
            .query(&mut redis.connection())
            .expect("DEL lease");
        let deadline = Instant::now() + Duration::from_secs(30);
        while redis.segments(topic, 0)[0].get("path").is_none() {
            assert!(
                Instant::now() < deadline,
                "not archived: {:?}",
                redis.segments(topic, 0)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    // Begun in Redis (its start written, `compacting_pass` set), or left
    // by a pass cut short: turning remote storage on gives it up at once.
    let topic = sealed_topic("remote-mid-pass");
    let (tag, running) = pass(&topic, 1);
    let meta = format!("ketch:{{{tag}}}:meta");
    assert!(hget(&meta, "compacting_pass").is_some());
    // validate_only changes nothing.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let check =
        raw::set_topic_config_request(&topic, "remote.storage.enable", "true").with_validate_only(true);
    let checked: kafka_protocol::messages::IncrementalAlterConfigsResponse = conn.request(1, &check);
    assert_eq!(checked.responses[0].error_code, code::NONE);
    assert!(
        hget(&meta, "compacting_pass").is_some(),
        "validate_only gave the pass up"
    );
    assert_eq!(alter(&ketch, &topic, "remote.storage.enable", "true"), code::NONE);
    assert_eq!(hget(&meta, "compacting_pass"), None, "the pass given up");
    proxy.release();
    given_up(&topic, &tag, running);

    // Not begun in Redis yet when it is turned on: the pass gives itself
    // up at its end.
    let topic = sealed_topic("remote-before-pass");
    let (tag, running) = pass(&topic, 0);
    assert_eq!(alter(&ketch, &topic, "remote.storage.enable", "true"), code::NONE);
    proxy.release();
    given_up(&topic, &tag, running);
}

/// A key put and deleted in the log's last batch (one producer batch
/// `[k=v, k=null]`) stays deleted: the pass that reaches the end keeps that
/// batch's last offset, but drops the value its tombstone supersedes, as
/// Kafka's cleaner does. Kept, the value outlived the tombstone once that
/// expired, and a consumer reading from the start saw the deleted key
/// again.
#[test]
fn a_key_deleted_in_the_last_batch_stays_deleted_once_its_tombstone_expires() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("tail-delete");
    create_compacted(&ketch, &topic, &[("delete.retention.ms", "1000")]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    produce(
        &mut conn,
        &topic,
        &[vec![keyed("deleted", Some("value")), keyed("deleted", None)]],
        None,
        &mut latest,
    );
    wait_compacted(&redis, &ketch, &topic, 2);
    // The end moves on: the batch is compacted as any other from now.
    produce(
        &mut conn,
        &topic,
        &[vec![keyed("later", Some("value"))]],
        None,
        &mut latest,
    );
    wait_compacted(&redis, &ketch, &topic, 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_all(&ketch, &topic) != expected(&latest, false) {
        assert!(
            Instant::now() < deadline,
            "after the tombstone expired: {:?}",
            read_all(&ketch, &topic)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A compacted partition with nothing new since its last pass costs the
/// storage worker's tick one read of its meta: the segment records (one
/// per segment ever sealed, never removed on a compact-only topic) are not
/// read every tick to find nothing due. (The gateway reaches Redis through
/// a proxy that counts the `ZRANGE` commands it sends; the sealing
/// script's bounded one runs inside Redis.)
#[test]
fn an_idle_compacted_partition_does_not_read_its_segments_every_tick() {
    let server = RedisServer::start();
    let proxy = DelayProxy::start(([127, 0, 0, 1], server.port()).into(), Duration::ZERO);
    let redis = TestRedis::Single(server);
    let ketch = Ketch::start(&proxy.redis_url(), &["--set", "tiering.tick_interval=50ms"]);
    let topic = unique_topic("compact-idle");
    create_compacted(&ketch, &topic, &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    let batches = [vec![keyed("a", Some("1"))], vec![keyed("a", Some("2"))]];
    produce(&mut conn, &topic, &batches, None, &mut latest);
    let end = redis.next_offset(&topic, 0);
    wait_compacted(&redis, &ketch, &topic, end);
    proxy.count_requests(b"ZRANGE");
    // Every tick runs the partition's sealing script: 40 of them is 20
    // ticks or more (a tick runs at most two scripts for it).
    let scripts = redis.command_calls("evalsha");
    let deadline = Instant::now() + Duration::from_secs(20);
    while redis.command_calls("evalsha") < scripts + 40 {
        assert!(Instant::now() < deadline, "the storage worker does not tick");
        std::thread::sleep(Duration::from_millis(20));
    }
    let reads = proxy.counted();
    assert!(
        reads <= 2,
        "{reads} reads of the segment records in 20 ticks or more"
    );
}

/// A fetch below `clean_end` reads the compacted stream at once once its
/// gateway has seen the partition's `clean_end`: it used to read the log
/// first (trimmed below `clean_end`: nothing there, or batches above it
/// thrown away) on every fetch to learn it, two reads where one does.
#[test]
fn fetches_below_clean_end_read_the_compacted_stream_at_once() {
    const FETCHES: u64 = 10;
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("compact-reads");
    create_compacted(&ketch, &topic, &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut latest = Latest::new();
    let batches = [vec![keyed("a", Some("1"))], vec![keyed("b", Some("2"))]];
    produce(&mut conn, &topic, &batches, None, &mut latest);
    let end = redis.next_offset(&topic, 0);
    wait_compacted(&redis, &ketch, &topic, end);
    // The whole log is compacted: every fetch from 0 is the compacted
    // stream's. The first one learns `clean_end`.
    assert_eq!(read_all(&ketch, &topic), expected(&latest, true));
    let before = redis.command_calls("xrange");
    for _ in 0..FETCHES {
        let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 0));
        let (error, _, records) = raw::fetch_result(&response);
        assert_eq!(error, code::NONE);
        assert_eq!(raw::split_batches(records.expect("records")).len(), 2);
    }
    let reads = redis.command_calls("xrange") - before;
    assert!(reads <= FETCHES + 2, "{reads} reads for {FETCHES} fetches");
}

/// Once turning remote storage on has checked a partition
/// (`archive_guard.lua`), no compaction pass starts or swaps in there for
/// the time it names: the config is written meanwhile, and a pass begun
/// between the check and that write saw remote storage off and swapped in,
/// trimming the log the archiver reads. The scripts, run as the gateways
/// run them.
#[test]
fn no_pass_starts_or_swaps_in_right_after_the_archive_guard() {
    let redis = TestRedis::start();
    let mut r = redis.connection();
    let (lease, compacting, meta, clean, segments, aborted) = (
        "ketch:{g}:lease",
        "ketch:{g}:compacting",
        "ketch:{g}:meta",
        "ketch:{g}:clean",
        "ketch:{g}:segments",
        "ketch:{g}:aborted",
    );
    let script = |text: &'static str| redis::Script::new(text);
    let add = script(include_str!("../../storage/src/scripts/compact_add.lua"));
    let swap = script(include_str!("../../storage/src/scripts/compact_swap.lua"));
    let guard = script(include_str!("../../storage/src/scripts/archive_guard.lua"));
    let start = |r: &mut ketch_tests::TestConnection, pass: &str| -> i64 {
        add.key(lease)
            .key(compacting)
            .key(meta)
            .arg("A")
            .arg(pass)
            .invoke(r)
            .expect("compact_add")
    };
    let swapped = |r: &mut ketch_tests::TestConnection, pass: &str| -> i64 {
        swap.key(meta)
            .key(lease)
            .key(compacting)
            .key(clean)
            .key(segments)
            .key(aborted)
            .arg(format!("A {pass}"))
            .arg("")
            .arg(10)
            .arg(100)
            .arg("")
            .arg(0)
            .invoke(r)
            .expect("compact_swap")
    };
    let hset = |r: &mut ketch_tests::TestConnection, field: &str, value: i64| {
        let () = redis::cmd("HSET")
            .arg(meta)
            .arg(field)
            .arg(value)
            .query(r)
            .expect("HSET");
    };
    let () = redis::cmd("SET").arg(lease).arg("A").query(&mut r).expect("SET");
    hset(&mut r, "next_offset", 10);
    hset(&mut r, "log_start", 0);

    // A pass under way is given up by the guard.
    assert_eq!(start(&mut r, "p1"), 1);
    let ready: i64 = guard
        .key(meta)
        .key(compacting)
        .arg("stop")
        .arg(60_000)
        .invoke(&mut r)
        .expect("archive_guard");
    assert_eq!(ready, 0);
    assert_eq!(swapped(&mut r, "p1"), 0, "the pass the guard gave up swapped in");
    // Within the minute, none starts.
    assert_eq!(start(&mut r, "p2"), 0, "a pass started after the guard");
    // Nor does one swap in that started before the time was set.
    hset(&mut r, "no_compaction_until", 0);
    assert_eq!(start(&mut r, "p3"), 1);
    hset(&mut r, "no_compaction_until", i64::MAX / 2);
    assert_eq!(
        swapped(&mut r, "p3"),
        0,
        "a pass swapped in within the guard's time"
    );
    // After it, passes go on as before.
    hset(&mut r, "no_compaction_until", 1);
    assert_eq!(start(&mut r, "p4"), 1);
    assert_eq!(swapped(&mut r, "p4"), 1);
    assert_eq!(meta_field(&mut r, meta, "clean_end"), Some(10));
}

fn meta_field(r: &mut ketch_tests::TestConnection, meta: &str, field: &str) -> Option<i64> {
    redis::cmd("HGET").arg(meta).arg(field).query(r).expect("HGET")
}

/// Turning remote storage on checks every partition before it gives up a
/// pass on any: a request refused because one partition was compacted
/// leaves the passes on the others, and their compaction, alone. Accepted,
/// it gives them up and pauses compaction there. (The partitions' fields
/// are set by hand on a `delete` topic, which no pass touches.)
#[test]
fn a_refused_remote_storage_change_gives_up_no_compaction_pass() {
    let redis = TestRedis::start();
    let ketch = gateway(&redis);
    let topic = unique_topic("guard-all-first");
    ketch.create_topic_with(
        &ketch_tests::runtime(),
        &topic,
        2,
        &[("cleanup.policy", "delete")],
    );
    let tags = redis.topic_tags(&topic);
    let meta = |p: usize| format!("ketch:{{{}}}:meta", tags[p]);
    let mut r = redis.connection();
    let hset = |r: &mut ketch_tests::TestConnection, key: &str, field: &str, value: &str| {
        let () = redis::cmd("HSET")
            .arg(key)
            .arg(field)
            .arg(value)
            .query(r)
            .expect("HSET");
    };
    let hget = |r: &mut ketch_tests::TestConnection, key: &str, field: &str| -> Option<String> {
        redis::cmd("HGET").arg(key).arg(field).query(r).expect("HGET")
    };
    // Partition 0 has a pass under way; partition 1 was compacted.
    hset(&mut r, &meta(0), "compacting_pass", "under-way");
    hset(&mut r, &meta(1), "clean_end", "5");
    assert_eq!(
        alter(&ketch, &topic, "remote.storage.enable", "true"),
        code::INVALID_CONFIG
    );
    assert_eq!(
        hget(&mut r, &meta(0), "compacting_pass").as_deref(),
        Some("under-way"),
        "the refused request gave a pass up"
    );
    assert_eq!(hget(&mut r, &meta(0), "no_compaction_until"), None);
    // Accepted, it gives the pass up and pauses compaction there.
    let () = redis::cmd("HDEL")
        .arg(meta(1))
        .arg("clean_end")
        .query(&mut r)
        .expect("HDEL");
    assert_eq!(alter(&ketch, &topic, "remote.storage.enable", "true"), code::NONE);
    assert_eq!(hget(&mut r, &meta(0), "compacting_pass"), None);
    assert!(hget(&mut r, &meta(0), "no_compaction_until").is_some());
}

//! Tiered storage end to end (DESIGN §7): sealed segments archived as
//! Parquet to the topic's Iceberg table (SQLite or PostgreSQL catalog, S3 or
//! local warehouse), trimmed from Redis, and read back by Kafka clients
//! across the tier boundary and by pyiceberg from the table.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ketch_tests::servers::{Postgres, RestCatalog, S3_ACCESS_KEY, S3_SECRET_KEY, S3Server};
use ketch_tests::{Ketch, TestRedis, runtime, unique_topic};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const BASE_TIMESTAMP: i64 = 1_700_000_000_000;

/// Record `i` of a test: key (null every 50th), a 100-byte value (null
/// every 97th), headers on some, timestamp increasing with `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: i64,
}

fn rec(i: usize) -> Rec {
    let key = (!i.is_multiple_of(50)).then(|| format!("k{i}").into_bytes());
    let value = (!i.is_multiple_of(97)).then(|| {
        let seed = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..100u64)
            .map(|j| (seed.rotate_left(j as u32) >> 7) as u8)
            .collect()
    });
    let headers = match i % 7 {
        0 => vec![("h".to_owned(), Some(i.to_string().into_bytes()))],
        1 => vec![("n".to_owned(), None), ("h".to_owned(), Some(Vec::new()))],
        _ => Vec::new(),
    };
    Rec {
        key,
        value,
        headers,
        timestamp: BASE_TIMESTAMP + i as i64,
    }
}

/// Produces records `0..count` round-robin to `partitions`, in order, so
/// record `i` lands at offset `i / partitions` of partition `i % partitions`
/// (asserted).
fn produce(
    producer: &FutureProducer,
    rt: &tokio::runtime::Runtime,
    topic: &str,
    partitions: usize,
    records: std::ops::Range<usize>,
) {
    const CHUNK: usize = 50_000;
    for chunk in records.clone().step_by(CHUNK) {
        let end = (chunk + CHUNK).min(records.end);
        let deliveries: Vec<_> = (chunk..end)
            .map(|i| {
                let r = rec(i);
                let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
                for (key, value) in &r.headers {
                    headers = headers.insert(Header {
                        key: key.as_str(),
                        value: value.as_ref(),
                    });
                }
                let mut record: FutureRecord<'_, Vec<u8>, Vec<u8>> = FutureRecord::to(topic)
                    .partition((i % partitions) as i32)
                    .timestamp(r.timestamp)
                    .headers(headers);
                if let Some(key) = &r.key {
                    record = record.key(key);
                }
                if let Some(value) = &r.value {
                    record = record.payload(value);
                }
                let delivery = producer.send_result(record).map_err(|(e, _)| e).expect("enqueue");
                async move { (i, delivery.await) }
            })
            .collect();
        for (i, result) in rt.block_on(join_all(deliveries)) {
            let delivery = result
                .expect("delivery future")
                .map_err(|(e, _)| e)
                .expect("delivered");
            assert_eq!(
                (delivery.partition, delivery.offset),
                ((i % partitions) as i32, (i / partitions) as i64),
                "record {i}"
            );
        }
    }
}

/// Consumes every partition from offset 0 up to `ends[p]` and checks each
/// record against [`rec`]: dense offsets, nothing missing or repeated.
fn consume_and_check(consumer: &BaseConsumer, topic: &str, ends: &[i64]) {
    consume_and_check_from(consumer, topic, &vec![0; ends.len()], ends);
}

/// [`consume_and_check`] from offset `starts[p]` of each partition.
fn consume_and_check_from(consumer: &BaseConsumer, topic: &str, starts: &[i64], ends: &[i64]) {
    let partitions = ends.len();
    let mut assignment = TopicPartitionList::new();
    for (p, start) in starts.iter().enumerate() {
        assignment
            .add_partition_offset(topic, p as i32, Offset::Offset(*start))
            .expect("assign");
    }
    consumer.assign(&assignment).expect("assign");
    let mut next = starts.to_vec();
    let total: i64 = ends.iter().zip(starts).map(|(end, start)| end - start).sum();
    let mut consumed = 0i64;
    let deadline = Instant::now() + Duration::from_secs(300);
    while consumed < total {
        assert!(Instant::now() < deadline, "consumed only {consumed} of {total}");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = match message {
            Ok(message) => message,
            // A gateway killed moments ago is listed until its lease
            // expires (cluster.node_timeout); the client retries elsewhere.
            Err(KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure)) => continue,
            Err(e) => panic!("consume: {e}"),
        };
        let p = message.partition() as usize;
        assert_eq!(message.offset(), next[p], "partition {p}: offsets must be dense");
        next[p] += 1;
        consumed += 1;
        let i = message.offset() as usize * partitions + p;
        let want = rec(i);
        let headers: Vec<(String, Option<Vec<u8>>)> = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let got = Rec {
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: message.timestamp().to_millis().expect("a timestamp"),
        };
        assert_eq!(got, want, "partition {p} offset {}", message.offset());
    }
    assert_eq!(next, ends, "every partition read to its end");
}

/// A partition's meta hash.
fn meta(redis: &TestRedis, topic: &str, partition: usize) -> HashMap<String, i64> {
    let tag = &redis.topic_tags(topic)[partition];
    let fields: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("ketch:{{{tag}}}:meta"))
        .query(&mut redis.connection())
        .expect("HGETALL meta");
    fields
        .into_iter()
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k, v)))
        .collect()
}

/// Waits until every partition's sealed segments are archived and, with
/// `trimmed`, removed from Redis (the local start is the open segment's
/// base), and no partition's open segment is due to be sealed by size
/// (`segment_bytes`), so nothing changes until more is produced. Returns
/// each partition's local start offset.
fn wait_archived(
    redis: &TestRedis,
    ketch: &Ketch,
    topic: &str,
    partitions: usize,
    trimmed: bool,
    segment_bytes: i64,
) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done: Vec<Option<i64>> = (0..partitions)
            .map(|p| {
                let m = meta(redis, topic, p);
                let local_start = m.get("local_start").copied().unwrap_or(0);
                let seg_base = m.get("seg_base").copied().unwrap_or(0);
                let all_archived = redis.segments(topic, p).iter().all(|s| s.get("path").is_some());
                let settled = m.get("seg_bytes").copied().unwrap_or(0) < segment_bytes;
                let ok = seg_base > 0 && settled && all_archived && (!trimmed || local_start == seg_base);
                ok.then_some(local_start)
            })
            .collect();
        if done.iter().all(Option::is_some) {
            return done.into_iter().map(Option::unwrap).collect();
        }
        assert!(
            Instant::now() < deadline,
            "archiving did not finish: {done:?}; metrics:\n{}",
            ketch.http_get("/metrics").1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the whole log of every partition is archived and trimmed
/// from Redis (the topic's `segment.ms` seals the last segment); returns
/// each partition's end offset.
fn wait_all_trimmed(redis: &TestRedis, ketch: &Ketch, topic: &str, partitions: usize) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ends: Vec<i64> = (0..partitions).map(|p| redis.next_offset(topic, p)).collect();
        let trimmed = (0..partitions)
            .all(|p| meta(redis, topic, p).get("local_start").copied().unwrap_or(0) == ends[p]);
        if trimmed {
            return ends;
        }
        assert!(
            Instant::now() < deadline,
            "the log is not all archived and trimmed; metrics:\n{}",
            ketch.http_get("/metrics").1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A metric's value from `/metrics`.
fn metric(ketch: &Ketch, name: &str) -> f64 {
    let (status, body) = ketch.http_get("/metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

/// Runs `tests/python/iceberg_check.py` on the table and panics with its
/// report unless the table holds exactly `ranges[p]` of partition `p`, each
/// partition's segments committed in order, and, with `codec` (Iceberg's
/// name, and the names pyarrow may give it in the data files' column
/// chunks), the table records the codec and every data file is written
/// in it.
fn pyiceberg_check(
    catalog_uri: &str,
    warehouse: &str,
    s3: Option<&S3Server>,
    topic: &str,
    ranges: &[(i64, i64)],
    codec: Option<(&str, &[&str])>,
) {
    let partitions = ranges.len();
    let mut samples = Vec::new();
    for (p, &(first, end)) in ranges.iter().enumerate() {
        for k in 0..5 {
            if end <= first {
                break;
            }
            let offset = first + (end - first - 1) * k / 4;
            let r = rec(offset as usize * partitions + p);
            samples.push(serde_json::json!({
                "partition": p, "offset": offset,
                "key": r.key.map(hex), "value": r.value.map(hex),
            }));
        }
    }
    let spec = serde_json::json!({
        "catalog_uri": catalog_uri,
        "catalog_name": "ketch",
        "namespace": "ketch",
        "table": topic,
        "warehouse": warehouse,
        "s3": s3.map(|s3| serde_json::json!({
            "endpoint": s3.endpoint(), "access_key": S3_ACCESS_KEY,
            "secret_key": S3_SECRET_KEY, "region": "us-east-1",
        })),
        "partitions": ranges.iter().enumerate()
            .map(|(p, r)| (p.to_string(), serde_json::json!([r.0, r.1])))
            .collect::<serde_json::Map<_, _>>(),
        "samples": samples,
        "codec": codec.map(|(name, in_files)| serde_json::json!({
            "table": name, "files": in_files,
        })),
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("spec.json");
    std::fs::write(&path, spec.to_string()).expect("write spec");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/iceberg_check.py");
    let output = Command::new("python3")
        .arg(script)
        .arg(&path)
        .output()
        .expect("run python3 (scripts/test.sh installs pyiceberg)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pyiceberg check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("pyiceberg: {stdout}");
}

fn hex(bytes: Vec<u8>) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A gateway whose storage worker ticks every 100 ms, with its data
/// directory (SQLite catalog, local warehouse) in `data_dir`; `extra` are
/// more `--set` values.
fn tiered_gateway(redis: &TestRedis, data_dir: &Path, extra: &[String]) -> Ketch {
    let mut args = Vec::new();
    set(&mut args, "tiering.tick_interval=100ms".to_owned());
    set(&mut args, format!("tiering.data_dir={}", data_dir.display()));
    for setting in extra {
        set(&mut args, setting.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Ketch::start(&redis.url(), &args)
}

/// The embedded catalog and local warehouse under `data_dir`, as pyiceberg
/// names them.
fn sqlite_catalog(data_dir: &Path) -> (String, String) {
    (
        format!("sqlite:///{}", data_dir.join("catalog.db").display()),
        format!("file://{}", data_dir.join("warehouse").display()),
    )
}

/// Creates a `remote.storage.enable` topic whose records are kept for ever
/// (`retention.ms=-1`: the test records are from 2023), with `configs`.
fn create_remote_topic(
    ketch: &Ketch,
    rt: &tokio::runtime::Runtime,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let mut all = vec![("remote.storage.enable", "true"), ("retention.ms", "-1")];
    all.extend_from_slice(configs);
    ketch.create_topic_with(rt, topic, partitions, &all);
}

/// Produces `rounds` × `per_round` records to partition 0, waiting after
/// each round until the worker sealed it: one segment per round.
fn produce_segments(
    producer: &FutureProducer,
    rt: &tokio::runtime::Runtime,
    redis: &TestRedis,
    topic: &str,
    rounds: usize,
    per_round: usize,
) {
    for round in 0..rounds {
        produce(producer, rt, topic, 1, round * per_round..(round + 1) * per_round);
        let deadline = Instant::now() + Duration::from_secs(60);
        while redis.segments(topic, 0).len() <= round {
            assert!(Instant::now() < deadline, "segment {round} not sealed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A new one-partition remote topic (name from `prefix`) of three
/// segments of `records / 3` records, archived and trimmed from Redis down
/// to the open segment: its name, local start offset and end offset.
fn archive_three_segments(
    ketch: &Ketch,
    redis: &TestRedis,
    prefix: &str,
    records: usize,
) -> (String, i64, i64) {
    let rt = runtime();
    let topic = unique_topic(prefix);
    create_remote_topic(
        ketch,
        &rt,
        &topic,
        1,
        &[("segment.bytes", "262144"), ("local.retention.bytes", "0")],
    );
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce_segments(&producer, &rt, redis, &topic, 3, records / 3);
    let local_starts = wait_archived(redis, ketch, &topic, 1, true, 262144);
    assert!(local_starts[0] > 0, "nothing trimmed from Redis");
    let end = redis.next_offset(&topic, 0);
    assert_eq!(end, (records / 3 * 3) as i64);
    (topic, local_starts[0], end)
}

fn set(args: &mut Vec<String>, setting: String) {
    args.push("--set".to_owned());
    args.push(setting);
}

/// The acceptance run: a million 100-byte records to 4 partitions,
/// archived to an S3 warehouse with a SQLite catalog in small segments and
/// trimmed from Redis down to the open segment; a consumer from offset 0
/// reads every record byte-identical across the tier boundary, ListOffsets
/// answers from the archive, and pyiceberg finds exactly the produced rows.
/// All four partitions are archived at once (`tiering.archive_partitions`),
/// their commits to the one table never conflicting (no failures counted)
/// and each partition's in order (pyiceberg).
#[test]
fn a_million_records_cross_the_tier_boundary_through_s3() {
    const RECORDS: usize = 1_000_000;
    const TAIL: usize = 4_000;
    const PARTITIONS: usize = 4;
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let s3 = S3Server::start(&dir.path().join("s3"), "lake");
    let data_dir = dir.path().join("data");
    let mut settings = s3.ketch_settings("warehouse");
    settings.push(format!("tiering.archive_partitions={PARTITIONS}"));
    let ketch = tiered_gateway(&redis, &data_dir, &settings);
    let rt = runtime();
    let topic = unique_topic("tiered");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        PARTITIONS as i32,
        &[("segment.bytes", "1048576"), ("local.retention.bytes", "0")],
    );
    let started = Instant::now();
    let producer = ketch.producer_with(&[("linger.ms", "5"), ("batch.size", "262144")]);
    produce(&producer, &rt, &topic, PARTITIONS, 0..RECORDS);
    eprintln!("produced {RECORDS} records in {:?}", started.elapsed());

    let local_starts = wait_archived(&redis, &ketch, &topic, PARTITIONS, true, 1048576);
    eprintln!(
        "archived and trimmed in {:?}: local starts {local_starts:?}",
        started.elapsed()
    );
    let segments = metric(&ketch, "ketch_archive_segments_total");
    assert!(segments >= 4.0);
    assert_eq!(metric(&ketch, "ketch_archive_failures_total"), 0.0);
    // Every archived segment's time is in the histogram.
    assert_eq!(metric(&ketch, "ketch_archive_segment_seconds_count"), segments);
    assert!(metric(&ketch, "ketch_archive_segment_seconds_sum") > 0.0);
    // The gauge follows the segment table a moment after the last mark.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&ketch, "ketch_archive_lag_seconds") != 0.0 {
        assert!(
            Instant::now() < deadline,
            "archive lag stays above zero after archiving"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // More records, in the open segment: the log now spans both tiers
    // (unless the tail fills a partition's open segment, which is then
    // sealed and archived as well).
    produce(&producer, &rt, &topic, PARTITIONS, RECORDS..RECORDS + TAIL);
    let ends: Vec<i64> = (0..PARTITIONS).map(|p| redis.next_offset(&topic, p)).collect();
    assert_eq!(ends.iter().sum::<i64>(), (RECORDS + TAIL) as i64);
    let in_redis: i64 = (0..PARTITIONS)
        .map(|p| ends[p] - meta(&redis, &topic, p)["local_start"])
        .sum();
    assert!(in_redis > 0, "some of the log is still only in Redis");
    for (p, local_start) in local_starts.iter().enumerate() {
        // Most of the log is in the archive only; Redis holds the open segment.
        assert!(
            *local_start > ends[p] * 3 / 4,
            "partition {p}: local start {local_start}"
        );
        let entries_left = redis.stream_len(&topic, p);
        assert!(
            entries_left < 200,
            "partition {p}: {entries_left} batches still in Redis"
        );
    }

    // ListOffsets: earliest is the archive's start; times resolve in the archive.
    let consumer = ketch.consumer();
    for (p, end) in ends.iter().enumerate() {
        let (low, high) = consumer
            .fetch_watermarks(&topic, p as i32, Duration::from_secs(10))
            .expect("watermarks");
        assert_eq!((low, high), (0, *end), "watermarks of partition {p}");
    }
    let target_offset = local_starts[1] / 3;
    let mut times = TopicPartitionList::new();
    times
        .add_partition_offset(
            &topic,
            1,
            Offset::Offset(rec(target_offset as usize * PARTITIONS + 1).timestamp),
        )
        .expect("add");
    let found = consumer
        .offsets_for_times(times, Duration::from_secs(10))
        .expect("offsets for times");
    assert_eq!(
        found.find_partition(&topic, 1).expect("partition 1").offset(),
        Offset::Offset(target_offset),
        "a timestamp in the archive resolves to its offset"
    );

    let consume_started = Instant::now();
    consume_and_check(&ketch.consumer(), &topic, &ends);
    eprintln!(
        "consumed {} records across tiers in {:?}",
        RECORDS + TAIL,
        consume_started.elapsed()
    );
    assert!(metric(&ketch, "ketch_remote_read_bytes_total") > 0.0);

    let (catalog, _) = sqlite_catalog(&data_dir);
    let local_starts = wait_archived(&redis, &ketch, &topic, PARTITIONS, true, 1048576);
    let ranges: Vec<(i64, i64)> = local_starts.iter().map(|&s| (0, s)).collect();
    pyiceberg_check(&catalog, "s3://lake/warehouse", Some(&s3), &topic, &ranges, None);
    // The data files are Parquet objects in the bucket.
    let parquet_files = walk(&s3.bucket_dir())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .count();
    assert!(parquet_files >= 4, "{parquet_files} Parquet files in the bucket");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// While the catalog is unreachable, segments are sealed but nothing is
/// archived or trimmed (failures are counted). Then kill -9 a gateway in
/// the middle of archiving: after a restart every offset is in the table
/// exactly once, and a consumer reads them all.
#[test]
fn kill9_during_archiving_leaves_every_offset_archived_once() {
    const ROUNDS: usize = 30;
    const PER_ROUND: usize = 5_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    // Nothing listens on this port: every archive attempt fails.
    let unreachable = format!("postgres://postgres@127.0.0.1:{}/none", ketch_tests::free_port());
    let lease = "tiering.lease_ttl=1s".to_owned();
    let mut down = tiered_gateway(
        &redis,
        &data_dir,
        &[lease.clone(), format!("tiering.catalog_uri={unreachable}")],
    );
    let rt = runtime();
    let topic = unique_topic("crash");
    create_remote_topic(
        &down,
        &rt,
        &topic,
        1,
        &[
            ("segment.bytes", "262144"),
            // The last segment is sealed by age, so all of the log is archived.
            ("segment.ms", "1000"),
            ("local.retention.bytes", "0"),
        ],
    );
    let producer = down.producer_with(&[("linger.ms", "5")]);
    produce_segments(&producer, &rt, &redis, &topic, ROUNDS, PER_ROUND);
    drop(producer);
    // Sealing went on while archiving failed (each attempt waits for the
    // catalog connection to time out).
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&down, "ketch_archive_failures_total") == 0.0 {
        assert!(Instant::now() < deadline, "no archive failure counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        metric(&down, "ketch_archive_lag_seconds") > 0.0,
        "sealed segments wait"
    );
    assert!(redis.segments(&topic, 0).iter().all(|s| s.get("path").is_none()));
    assert_eq!(
        meta(&redis, &topic, 0).get("local_start").copied().unwrap_or(0),
        0,
        "nothing trimmed"
    );
    down.kill9();

    // A gateway that can reach the catalog; killed once a few segments are in.
    let mut ketch = tiered_gateway(&redis, &data_dir, &[lease]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&ketch, "ketch_archive_segments_total") < 3.0 {
        assert!(Instant::now() < deadline, "nothing archived");
        std::thread::sleep(Duration::from_millis(10));
    }
    ketch.kill9();
    let sealed = redis.segments(&topic, 0);
    let archived_before = sealed.iter().filter(|s| s.get("path").is_some()).count();
    eprintln!(
        "killed with {archived_before} of {} sealed segments archived",
        sealed.len()
    );
    assert!(
        archived_before < sealed.len(),
        "the kill came after archiving finished"
    );

    ketch.restart();
    let local_starts = wait_archived(&redis, &ketch, &topic, 1, true, 262144);
    let records = (ROUNDS * PER_ROUND) as i64;
    assert!(local_starts[0] > 0);
    assert_eq!(
        wait_all_trimmed(&redis, &ketch, &topic, 1),
        [records],
        "every record archived and trimmed"
    );
    let (catalog, warehouse) = sqlite_catalog(&data_dir);
    pyiceberg_check(&catalog, &warehouse, None, &topic, &[(0, records)], None);
    consume_and_check(&ketch.consumer(), &topic, &[records]);
}

/// A crash after the Iceberg commit but before Redis records it: the
/// worker finds its commit in the table's history and does not archive the
/// segment a second time.
#[test]
fn a_commit_redis_never_heard_of_is_recognised_not_repeated() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    let ketch = tiered_gateway(&redis, &data_dir, &[]);
    let rt = runtime();
    let topic = unique_topic("repair");
    // Local retention off: the segments stay in Redis, as they do until
    // Redis has heard of the commit.
    create_remote_topic(&ketch, &rt, &topic, 1, &[("segment.bytes", "65536")]);
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce_segments(&producer, &rt, &redis, &topic, 3, 2_000);
    wait_archived(&redis, &ketch, &topic, 1, false, 65536);
    let archived = metric(&ketch, "ketch_archive_segments_total");
    let all = redis.segments(&topic, 0);
    assert!(all.len() >= 3, "{} segments", all.len());

    // Forget, in Redis, that the middle segment was archived.
    let tag = &redis.topic_tags(&topic)[0];
    let key = format!("ketch:{{{tag}}}:segments");
    let victim = &all[1];
    let mut forgotten = victim.clone();
    let path = forgotten
        .as_object_mut()
        .unwrap()
        .remove("path")
        .expect("archived");
    forgotten.as_object_mut().unwrap().remove("file_bytes");
    let file = path
        .as_str()
        .unwrap()
        .strip_prefix("file://")
        .expect("a local file")
        .to_owned();
    let written_at = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .expect("data file");
    let mut conn = redis.connection();
    let removed: i64 = redis::cmd("ZREM")
        .arg(&key)
        .arg(victim.to_string())
        .query(&mut conn)
        .unwrap_or(0);
    if removed == 0 {
        // Lua's JSON encoding differs from serde's: remove by score instead.
        let _: i64 = redis::cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg(victim["base"].as_i64().unwrap())
            .arg(victim["base"].as_i64().unwrap())
            .query(&mut conn)
            .expect("ZREMRANGEBYSCORE");
    }
    let _: i64 = redis::cmd("ZADD")
        .arg(&key)
        .arg(victim["base"].as_i64().unwrap())
        .arg(forgotten.to_string())
        .query(&mut conn)
        .expect("ZADD");

    wait_archived(&redis, &ketch, &topic, 1, false, 65536);
    let again = redis.segments(&topic, 0);
    assert_eq!(
        again[1]["path"], path,
        "the segment points at its committed file again"
    );
    assert_eq!(
        metric(&ketch, "ketch_archive_segments_total"),
        archived,
        "no segment was written again"
    );
    assert_eq!(
        std::fs::metadata(&file)
            .and_then(|m| m.modified())
            .expect("data file"),
        written_at,
        "the data file was not rewritten"
    );
    let (catalog, warehouse) = sqlite_catalog(&data_dir);
    let archived_end = again.last().unwrap()["last"].as_i64().unwrap() + 1;
    pyiceberg_check(&catalog, &warehouse, None, &topic, &[(0, archived_end)], None);
}

/// The same flow with the catalog in PostgreSQL and the warehouse on
/// local disk.
#[test]
fn postgres_catalog_archives_and_serves_the_archive() {
    const RECORDS: usize = 100_000;
    const PARTITIONS: usize = 2;
    let postgres = Postgres::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    let ketch = tiered_gateway(
        &redis,
        &data_dir,
        &[format!("tiering.catalog_uri={}", postgres.url())],
    );
    let rt = runtime();
    let topic = unique_topic("pg");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        PARTITIONS as i32,
        &[("segment.bytes", "524288"), ("local.retention.bytes", "0")],
    );
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce(&producer, &rt, &topic, PARTITIONS, 0..RECORDS);
    let local_starts = wait_archived(&redis, &ketch, &topic, PARTITIONS, true, 524288);
    let ends: Vec<i64> = (0..PARTITIONS).map(|p| redis.next_offset(&topic, p)).collect();
    consume_and_check(&ketch.consumer(), &topic, &ends);
    assert!(
        !data_dir.join("catalog.db").exists(),
        "no SQLite catalog with PostgreSQL configured"
    );
    let catalog = postgres.url().replace("postgres://", "postgresql+psycopg2://");
    let warehouse = format!("file://{}", data_dir.join("warehouse").display());
    let ranges: Vec<(i64, i64)> = local_starts.iter().map(|&s| (0, s)).collect();
    pyiceberg_check(&catalog, &warehouse, None, &topic, &ranges, None);
}

/// The same flow through an Iceberg REST catalog (a pyiceberg-backed
/// fixture, since no REST catalog server can run here): the table it
/// serves is read back by pyiceberg through the catalog's database.
#[test]
fn rest_catalog_archives_and_serves_the_archive() {
    const RECORDS: usize = 50_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let rest_db = dir.path().join("rest/catalog.db");
    let warehouse = format!("file://{}", dir.path().join("rest-warehouse").display());
    let catalog = RestCatalog::start(&rest_db, &warehouse);
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    let ketch = tiered_gateway(
        &redis,
        &data_dir,
        &[
            "tiering.catalog=rest".to_owned(),
            format!("tiering.catalog_uri={}", catalog.url()),
        ],
    );
    let (topic, local_start, end) = archive_three_segments(&ketch, &redis, "rest", RECORDS);
    assert!(
        !data_dir.join("catalog.db").exists(),
        "no SQLite catalog with REST configured"
    );
    consume_and_check(&ketch.consumer(), &topic, &[end]);
    let sql = format!("sqlite:///{}", rest_db.display());
    pyiceberg_check(&sql, &warehouse, None, &topic, &[(0, local_start)], None);
}

/// `tiering.compression=lz4`: the archive is written in Parquet's LZ4_RAW,
/// which the gateway's own remote reads decode (a consumer reads every
/// record across the tier boundary) and pyiceberg reads too; the table
/// records the codec (Iceberg's `lz4_raw`) and every column chunk of every
/// data file is in it.
#[test]
fn an_archive_written_in_lz4_is_served_and_read_by_pyiceberg() {
    const RECORDS: usize = 30_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    let ketch = tiered_gateway(&redis, &data_dir, &["tiering.compression=lz4".to_owned()]);
    let (topic, local_start, end) = archive_three_segments(&ketch, &redis, "lz4", RECORDS);
    consume_and_check(&ketch.consumer(), &topic, &[end]);
    let (catalog, warehouse) = sqlite_catalog(&data_dir);
    // pyarrow names Parquet's LZ4_RAW "LZ4" (its older framing, which ketch
    // does not write, "LZ4_HADOOP"); a zstd file would say "ZSTD".
    pyiceberg_check(
        &catalog,
        &warehouse,
        None,
        &topic,
        &[(0, local_start)],
        Some(("lz4_raw", &["LZ4", "LZ4_RAW"])),
    );
}

/// Retention on a remote-storage topic: `local.retention.ms` trims archived
/// segments from Redis (the records are from 2023, so at once);
/// `retention.bytes` moves the log start clients see, while the Iceberg
/// rows stay; DeleteRecords into the archived range moves the log start
/// but never the local start back; a fetch between the two reads the archive.
#[test]
fn retention_on_a_remote_topic_moves_the_log_start_and_keeps_the_rows() {
    use ketch_tests::raw::{self, KafkaConn, code};

    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    let ketch = tiered_gateway(&redis, &data_dir, &[]);
    let rt = runtime();
    let topic = unique_topic("kept");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        1,
        &[
            ("segment.bytes", "65536"),
            ("segment.ms", "1000"),
            ("local.retention.ms", "3600000"),
        ],
    );
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    const ROUNDS: usize = 4;
    const PER_ROUND: usize = 2_000;
    produce_segments(&producer, &rt, &redis, &topic, ROUNDS, PER_ROUND);
    let records = (ROUNDS * PER_ROUND) as i64;
    assert_eq!(
        wait_all_trimmed(&redis, &ketch, &topic, 1),
        [records],
        "local.retention.ms trimmed every archived segment"
    );
    assert_eq!(redis.stream_len(&topic, 0), 0);

    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, -2).1,
        0,
        "earliest: the archive's start"
    );
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, -4).1,
        records,
        "earliest local"
    );
    // Timestamps resolve in the archive: record i has timestamp BASE + i.
    let (_, offset, timestamp) = raw::list_offsets(&mut conn, &topic, 0, -3);
    assert_eq!(
        (offset, timestamp),
        (records - 1, rec(records as usize - 1).timestamp),
        "max timestamp"
    );
    let (_, offset, timestamp) = raw::list_offsets(&mut conn, &topic, 0, BASE_TIMESTAMP + 4_321);
    assert_eq!(
        (offset, timestamp),
        (4_321, BASE_TIMESTAMP + 4_321),
        "by timestamp"
    );

    // DeleteRecords into the archived range.
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 100), (code::NONE, 100));
    assert_eq!(
        meta(&redis, &topic, 0)["local_start"],
        records,
        "the local start stays"
    );
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 99, 100));
    assert_eq!(raw::fetch_result(&response).0, code::OFFSET_OUT_OF_RANGE);
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 100, 100));
    let (error, high_watermark, batches) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, records));
    let batches = batches.expect("records from the archive");
    assert_eq!(
        i64::from_be_bytes(batches[0..8].try_into().unwrap()),
        100,
        "starts at the fetch offset"
    );
    assert!(raw::count_records(&batches) > 0);

    // The first two segments hold what retention.bytes keeps no more: the
    // log start moves to a segment boundary; the table keeps every row.
    let all = redis.segments(&topic, 0);
    let kept: i64 = all[2..].iter().map(|s| s["bytes"].as_i64().unwrap()).sum();
    set_topic_config(&ketch, &topic, "retention.bytes", &kept.to_string());
    let third_base = all[2]["base"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while raw::list_offsets(&mut conn, &topic, 0, -2).1 != third_base {
        assert!(
            Instant::now() < deadline,
            "retention.bytes did not move the log start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (catalog, warehouse) = sqlite_catalog(&data_dir);
    pyiceberg_check(&catalog, &warehouse, None, &topic, &[(0, records)], None);
}

/// A tiered gateway and a topic of one partition whose 20 records, one
/// batch each (the timestamp of offset `i` is `timestamp(i)`), are archived
/// in short segments and trimmed from Redis; a raw connection to it.
/// (Fields drop in order: the connection, the gateway, Redis, the
/// directory.)
struct Archived20 {
    topic: String,
    conn: ketch_tests::raw::KafkaConn,
    _ketch: Ketch,
    redis: TestRedis,
    _dir: tempfile::TempDir,
}

fn archived_20(name: &str, timestamp: impl Fn(i64) -> i64) -> Archived20 {
    use ketch_tests::batch::{self, Record};
    use ketch_tests::raw::{self, KafkaConn, code};

    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let topic = unique_topic(name);
    create_remote_topic(
        &ketch,
        &runtime(),
        &topic,
        1,
        &[("segment.ms", "200"), ("local.retention.bytes", "0")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for i in 0..20 {
        let batch = batch::encode(&[Record::value(timestamp(i), b"v")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, batch).0, code::NONE);
    }
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, 1), [20]);
    Archived20 {
        _dir: dir,
        redis,
        _ketch: ketch,
        topic,
        conn,
    }
}

/// ListOffsets -3 in an archive whose segment's largest timestamp is no
/// longer there (below the log start here; a transaction marker's, which
/// is not archived, in the same way): the largest of what the archive still
/// holds answers, not -1. And -5 (KIP-1005) answers the last offset the
/// archive holds.
#[test]
fn the_max_timestamp_is_the_largest_the_archive_still_holds() {
    use ketch_tests::raw::{self, KafkaConn, code};

    let base = BASE_TIMESTAMP;
    // Offset 10 holds the largest timestamp.
    let mut archived = archived_20(
        "max-archived",
        |i| if i == 10 { base + 1_000_000 } else { base + i },
    );
    let (topic, conn) = (archived.topic.clone(), &mut archived.conn);
    assert_eq!(
        raw::list_offsets(conn, &topic, 0, -3),
        (code::NONE, 10, base + 1_000_000)
    );
    // -5 (v9, KIP-1005): the last offset the archive holds, with its epoch.
    let latest_tiered = |conn: &mut KafkaConn| {
        let response = conn.request(9, &raw::list_offsets_request(&topic, 0, -5));
        let p = &response.topics[0].partitions[0];
        (p.error_code, p.offset, p.leader_epoch)
    };
    assert_eq!(latest_tiered(conn), (code::NONE, 19, 0));
    assert_eq!(raw::delete_records(conn, &topic, 0, 15), (code::NONE, 15));
    assert_eq!(
        raw::list_offsets(conn, &topic, 0, -3),
        (code::NONE, 19, base + 19)
    );
    assert_eq!(latest_tiered(conn), (code::NONE, 19, 0), "after DeleteRecords");
}

/// A read_committed fetch that steps over an archived aborted transaction
/// (its records and marker are not archived: a hole) into Redis lists the
/// aborted transactions from the first offset it sends, as Kafka collects
/// them from the first batch it reads: it listed the skipped one, whose
/// marker it never sent, and a client then skipped the producer's next,
/// committed, transaction too.
#[test]
fn a_read_committed_fetch_over_an_archived_abort_keeps_the_next_commit() {
    use ketch_tests::raw::{self, KafkaConn, code};
    use rdkafka::producer::Producer;

    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let rt = runtime();
    let topic = unique_topic("archived-abort");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        1,
        &[("segment.ms", "200"), ("local.retention.bytes", "0")],
    );
    let producer = ketch.producer_with(&[("transactional.id", &unique_topic("txn"))]);
    producer.init_transactions(Duration::from_secs(30)).expect("init");
    let transaction = |value: &str, commit: bool| {
        producer.begin_transaction().unwrap();
        let sent: Vec<_> = (0..3)
            .map(|_| {
                producer
                    .send_result(FutureRecord::<(), _>::to(&topic).payload(value).partition(0))
                    .map_err(|(e, _)| e)
                    .expect("queued")
            })
            .collect();
        producer.flush(Duration::from_secs(30)).unwrap();
        if commit {
            producer
                .commit_transaction(Duration::from_secs(30))
                .expect("commit");
        } else {
            producer
                .abort_transaction(Duration::from_secs(30))
                .expect("abort");
        }
        for delivery in sent {
            let _ = rt.block_on(delivery);
        }
    };
    transaction("committed", true);
    transaction("aborted", false);
    // Sealed, archived and trimmed: the aborted transaction's three records
    // and its marker end the archive.
    let [end] = wait_all_trimmed(&redis, &ketch, &topic, 1)[..] else {
        panic!("one partition")
    };
    let aborted_first = end - 4;
    transaction("next", true);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let response = conn.request(
        raw::FETCH_VERSION,
        &raw::fetch_request(&topic, 0, aborted_first, 0).with_isolation_level(1),
    );
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::NONE);
    let listed: Vec<i64> = partition
        .aborted_transactions
        .iter()
        .flatten()
        .map(|a| a.first_offset)
        .collect();
    assert!(
        !listed.contains(&aborted_first),
        "the skipped transaction is listed: {listed:?}"
    );
    let batches = partition.records.clone().expect("the next transaction's records");
    assert_eq!(
        i64::from_be_bytes(batches[0..8].try_into().unwrap()),
        end,
        "served from the next transaction"
    );
}

/// A fetch that reads the archive is answered as soon as the read is done,
/// whatever its `min_bytes` (Kafka answers a fetch with a remote read when
/// that read completes: it used to wait for appends until `max_wait`); and
/// a read the object store does not answer is cut off after
/// `tiering.remote_fetch_max_wait`, answering that partition with no records
/// and the fetch's other partitions with theirs (it held them all until the
/// object store's own timeouts, seconds to minutes).
#[test]
fn a_fetch_from_the_archive_neither_waits_for_min_bytes_nor_for_a_frozen_object_store() {
    use ketch_tests::batch::{self, Record};
    use ketch_tests::raw::{self, KafkaConn, code};

    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let s3 = S3Server::start(&dir.path().join("s3"), "lake");
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &s3.ketch_settings("warehouse"));
    let rt = runtime();
    let topic = unique_topic("remote-wait");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        2,
        &[("segment.ms", "200"), ("local.retention.bytes", "0")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let produce = |conn: &mut KafkaConn, partition: i32, n: i64| {
        for i in 0..n {
            let batch = batch::encode(&[Record::value(BASE_TIMESTAMP + i, b"v")]);
            let request = raw::produce_request(&topic, partition, batch);
            assert_eq!(raw::produce_result(&conn.request(9, &request)).0, code::NONE);
        }
    };
    produce(&mut conn, 0, 20);
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, 2), [20, 0]);

    // min_bytes far above what the archive holds: answered at once.
    let mut request = raw::fetch_request(&topic, 0, 5, 3_000).with_min_bytes(10 << 20);
    request.topics[0].partitions[0].partition_max_bytes = 1 << 20;
    let started = Instant::now();
    let (error, _, records) = raw::fetch_result(&conn.request(raw::FETCH_VERSION, &request));
    assert_eq!(error, code::NONE);
    assert!(raw::count_records(&records.expect("records")) > 0);
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "answered after {:?}",
        started.elapsed()
    );

    // The object store stops answering; partition 1 has records in Redis.
    produce(&mut conn, 1, 3);
    let frozen = ketch_tests::Frozen::freeze(s3.pid());
    let ketch_cold = tiered_gateway(
        &redis,
        &dir.path().join("data-cold"),
        &s3.ketch_settings("warehouse"),
    );
    let mut cold = KafkaConn::connect(ketch_cold.kafka_addr());
    let request = raw::fetch_partitions_request(&topic, &[(0, 0), (1, 0)], 1 << 20).with_max_wait_ms(500);
    let started = Instant::now();
    let response = cold.request(raw::FETCH_VERSION, &request);
    let elapsed = started.elapsed();
    let partitions = &response.responses[0].partitions;
    assert_eq!(
        (partitions[0].error_code, partitions[1].error_code),
        (code::NONE, code::NONE)
    );
    assert_eq!(
        partitions[0]
            .records
            .as_ref()
            .map_or(0, |r| raw::count_records(r)),
        0,
        "the archive's partition, unanswered"
    );
    assert_eq!(
        raw::count_records(partitions[1].records.as_ref().expect("Redis's partition")),
        3
    );
    assert!(
        elapsed < Duration::from_millis(2_500),
        "answered after {elapsed:?}"
    );
    // The object store answers again: so does the archive.
    drop(frozen);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = cold.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 0));
        let (error, _, records) = raw::fetch_result(&response);
        if error == code::NONE && records.as_ref().is_some_and(|r| raw::count_records(r) > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the archive is never read again: error {error}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A ListOffsets request's lookups by timestamp share one bound,
/// `tiering.remote_list_offsets_timeout` (Kafka's
/// `remote.list.offsets.request.timeout.ms`): over an object store that
/// stopped answering, a request for more partitions than a request looks
/// up at once (32) is answered REQUEST_TIMED_OUT for each once the bound
/// passed, not once per wave of partitions.
#[test]
fn a_list_offsets_request_over_a_frozen_object_store_answers_after_its_bound() {
    use ketch_tests::batch::{self, Record};
    use ketch_tests::raw::{self, KafkaConn, code};

    const PARTITIONS: i32 = 34;
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let s3 = S3Server::start(&dir.path().join("s3"), "lake");
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &s3.ketch_settings("warehouse"));
    let rt = runtime();
    let topic = unique_topic("remote-list-offsets");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        PARTITIONS,
        &[("segment.ms", "200"), ("local.retention.bytes", "0")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for partition in 0..PARTITIONS {
        let batch = batch::encode(&[Record::value(BASE_TIMESTAMP, b"v")]);
        let request = raw::produce_request(&topic, partition, batch);
        assert_eq!(raw::produce_result(&conn.request(9, &request)).0, code::NONE);
    }
    wait_all_trimmed(&redis, &ketch, &topic, PARTITIONS as usize);
    // Found in the archive while it answers.
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, BASE_TIMESTAMP),
        (code::NONE, 0, BASE_TIMESTAMP)
    );

    let _frozen = ketch_tests::Frozen::freeze(s3.pid());
    let mut settings = s3.ketch_settings("warehouse");
    settings.push("tiering.remote_list_offsets_timeout=1s".to_owned());
    let cold = tiered_gateway(&redis, &dir.path().join("data-cold"), &settings);
    let mut request = raw::list_offsets_request(&topic, 0, BASE_TIMESTAMP);
    let one = request.topics[0].partitions[0].clone();
    request.topics[0].partitions = (0..PARTITIONS)
        .map(|p| one.clone().with_partition_index(p))
        .collect();
    let started = Instant::now();
    let response = KafkaConn::connect(cold.kafka_addr()).request(8, &request);
    let elapsed = started.elapsed();
    let codes: Vec<i16> = response.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(codes, vec![code::REQUEST_TIMED_OUT; PARTITIONS as usize]);
    assert!(
        elapsed < Duration::from_millis(1_900),
        "answered after {elapsed:?} (two waves of the bound take 2 s)"
    );
}

/// Sets a topic config through IncrementalAlterConfigs (SET); every
/// gateway applies it within half a second.
fn set_topic_config(ketch: &Ketch, topic: &str, name: &str, value: &str) {
    let mut conn = ketch_tests::raw::KafkaConn::connect(ketch.kafka_addr());
    let error = ketch_tests::raw::set_topic_config(&mut conn, topic, name, value);
    assert_eq!(error, 0, "{name}={value}");
}

/// DeleteRecords into a segment not yet archived: the segment is archived
/// from the batch holding the new log start (what came before is gone
/// from Redis, and Kafka never copies deleted records to remote storage),
/// and one wholly below the log start is not archived but let go. Archiving
/// failed on such a segment at every tick, and nothing after it was ever
/// archived or trimmed.
#[test]
fn delete_records_into_an_unarchived_segment_leaves_archiving_going() {
    use ketch_tests::raw::{self, KafkaConn, code};

    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let rt = runtime();
    let topic = unique_topic("deleted-unarchived");
    // The open segments stay open until the records are deleted.
    create_remote_topic(&ketch, &rt, &topic, 2, &[("segment.ms", "86400000")]);
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce(&producer, &rt, &topic, 2, 0..4_000);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    // Partition 0 from the middle of its segment; partition 1 all of it.
    assert_eq!(
        raw::delete_records(&mut conn, &topic, 0, 1_500),
        (code::NONE, 1_500)
    );
    assert_eq!(raw::delete_records(&mut conn, &topic, 1, -1), (code::NONE, 2_000));
    set_topic_config(&ketch, &topic, "segment.ms", "200");
    produce(&producer, &rt, &topic, 2, 4_000..6_000);
    set_topic_config(&ketch, &topic, "local.retention.bytes", "0");
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, 2), [3_000, 3_000]);
    assert_eq!(metric(&ketch, "ketch_archive_failures_total"), 0.0);
    // Everything from the log starts is read back, from the archive.
    consume_and_check_from(&ketch.consumer(), &topic, &[1_500, 2_000], &[3_000, 3_000]);
}

/// Redis taken back to before a segment's seal after the segment was
/// archived (a failover to a replica that had not seen the seal, a crash
/// under `appendfsync everysec`): the offsets after the segment are
/// written again, and the next seal gives a longer segment of the same
/// base, whose name the table already lists. Its file lacks the new
/// records; recorded as the segment's, they were holes, lost once local
/// retention trimmed them. Now the segment is quarantined with the reason
/// and served from Redis, every record read back.
#[test]
fn a_segment_sealed_again_after_redis_went_back_is_not_recorded_in_the_old_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut redis = TestRedis::Single(ketch_tests::RedisServer::start());
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let rt = runtime();
    let topic = unique_topic("went-back");
    create_remote_topic(&ketch, &rt, &topic, 1, &[("segment.ms", "86400000")]);
    produce(&ketch.producer(), &rt, &topic, 1, 0..100);
    let () = redis::cmd("SAVE").query(&mut redis.connection()).expect("SAVE");
    set_topic_config(&ketch, &topic, "segment.ms", "200");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !redis.segments(&topic, 0).iter().any(|s| s.get("path").is_some()) {
        assert!(Instant::now() < deadline, "the first segment was not archived");
        std::thread::sleep(Duration::from_millis(50));
    }
    let TestRedis::Single(server) = &mut redis else {
        unreachable!("started single")
    };
    server.stop();
    server.start_again();
    assert!(
        redis.segments(&topic, 0).is_empty(),
        "Redis is back before the seal"
    );

    produce(&ketch.producer(), &rt, &topic, 1, 100..200);
    set_topic_config(&ketch, &topic, "segment.ms", "200");
    let deadline = Instant::now() + Duration::from_secs(60);
    let segment = loop {
        let segments = redis.segments(&topic, 0);
        if let Some(s) = segments.iter().find(|s| s.get("quarantine").is_some()) {
            break s.clone();
        }
        assert!(
            segments.iter().all(|s| s.get("path").is_none()),
            "recorded in the old file: {segments:?}"
        );
        assert!(Instant::now() < deadline, "not quarantined: {segments:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (segment["base"].as_i64(), segment["last"].as_i64()),
        (Some(0), Some(199))
    );
    let reason = segment["quarantine"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("another segment's"), "{reason}");
    consume_and_check(&ketch.consumer(), &topic, &[200]);
}

/// `remote.log.copy.disable=true`: the archive is read but no longer
/// written, and retention deletes segments without waiting for it.
#[test]
fn a_read_only_archive_is_served_and_no_longer_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let rt = runtime();
    let topic = unique_topic("read-only");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        1,
        &[
            ("segment.bytes", "65536"),
            ("segment.ms", "200"),
            ("local.retention.bytes", "0"),
        ],
    );
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce(&producer, &rt, &topic, 1, 0..2_000);
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, 1), [2_000]);
    let archived = metric(&ketch, "ketch_archive_records_total");
    assert_eq!(archived, 2_000.0);

    // Kafka's rule: local retention as retention once copying stops.
    let mut conn = ketch_tests::raw::KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        ketch_tests::raw::set_topic_config(&mut conn, &topic, "remote.log.copy.disable", "true"),
        ketch_tests::raw::code::INVALID_CONFIG,
        "INVALID_CONFIG while local.retention.bytes differs from retention.bytes"
    );
    set_topic_config(&ketch, &topic, "local.retention.bytes", "-2");
    set_topic_config(&ketch, &topic, "remote.log.copy.disable", "true");
    produce(&producer, &rt, &topic, 1, 2_000..4_000);
    let deadline = Instant::now() + Duration::from_secs(60);
    while redis
        .segments(&topic, 0)
        .iter()
        .all(|s| s["base"].as_i64() < Some(2_000))
    {
        assert!(Instant::now() < deadline, "the new records were not sealed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The archive still serves what it holds, Redis the rest.
    consume_and_check(&ketch.consumer(), &topic, &[4_000]);

    // Retention deletes the new segments without archiving them (the
    // records are from 2023).
    set_topic_config(&ketch, &topic, "retention.ms", "1");
    let sealed_end = |redis: &TestRedis| {
        redis
            .segments(&topic, 0)
            .iter()
            .filter_map(|s| s["last"].as_i64())
            .max()
            .map_or(0, |last| last + 1)
    };
    let mut conn = ketch_tests::raw::KafkaConn::connect(ketch.kafka_addr());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log_start = ketch_tests::raw::list_offsets(&mut conn, &topic, 0, -2).1;
        if log_start > 2_000 && redis.segments(&topic, 0).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "retention did not pass the unarchived segments (log start {log_start}, sealed to {})",
            sealed_end(&redis)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        metric(&ketch, "ketch_archive_records_total"),
        archived,
        "nothing was archived after remote.log.copy.disable"
    );
}

/// Remote storage turned on for a topic that has been running without it:
/// the segments it sealed before are archived, trimmed from Redis by local
/// retention and read back from the archive.
#[test]
fn remote_storage_turned_on_for_a_running_topic_archives_its_sealed_segments() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let rt = runtime();
    let topic = unique_topic("turned-on");
    ketch.create_topic_with(
        &rt,
        &topic,
        1,
        &[
            ("retention.ms", "-1"),
            ("segment.bytes", "65536"),
            ("segment.ms", "1000"),
        ],
    );
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce_segments(&producer, &rt, &redis, &topic, 2, 1_000);
    let sealed = redis.segments(&topic, 0);
    assert!(
        sealed.iter().all(|s| s.get("path").is_none()),
        "nothing is archived before: {sealed:?}"
    );

    set_topic_config(&ketch, &topic, "remote.storage.enable", "true");
    set_topic_config(&ketch, &topic, "local.retention.bytes", "0");
    let ends = wait_all_trimmed(&redis, &ketch, &topic, 1);
    assert_eq!(ends, [2_000]);
    assert_eq!(redis.stream_len(&topic, 0), 0, "Redis holds nothing of it");
    consume_and_check(&ketch.consumer(), &topic, &ends);
}

/// A segment whose batches jump in size, from 600 KB to a few hundred
/// bytes and back, is archived record for record. The archiver reads a
/// segment in chunks, each sized from the one before (and telling the
/// data connection how long its reply will be): here a chunk of large
/// batches is followed by one of small ones (room made for far more than
/// arrives), and a chunk sized from small batches holds large ones (a
/// reply far longer than expected).
#[test]
fn a_segment_of_small_and_large_batches_is_archived_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &[]);
    let rt = runtime();
    let topic = unique_topic("sizes");
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        1,
        &[
            // One segment: sealed by time once all is produced.
            ("segment.bytes", "67108864"),
            ("segment.ms", "3000"),
            ("local.retention.bytes", "0"),
        ],
    );
    // Record i's value: 600 KB for the first ten and twelve in the middle
    // (chunks of 4, 6, 6 and 4,096 entries), else 100 B.
    let value = |i: usize| {
        let len = if i < 10 || (300..312).contains(&i) {
            600_000
        } else {
            100
        };
        (0..len).map(|j| (i * 31 + j * 7) as u8).collect::<Vec<u8>>()
    };
    const RECORDS: usize = 612;
    let producer = ketch.producer_with(&[("linger.ms", "0")]);
    for i in 0..RECORDS {
        // One record per batch: sent after the last is delivered.
        let payload = value(i);
        let delivery = rt
            .block_on(
                producer.send(
                    FutureRecord::<(), Vec<u8>>::to(&topic)
                        .partition(0)
                        .payload(&payload),
                    Duration::from_secs(10),
                ),
            )
            .map_err(|(e, _)| e)
            .expect("delivered");
        assert_eq!(delivery.offset, i as i64);
    }
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, 1), [RECORDS as i64]);
    assert_eq!(redis.stream_len(&topic, 0), 0, "Redis holds nothing of it");
    assert_eq!(metric(&ketch, "ketch_archive_failures_total"), 0.0);

    let consumer = ketch.consumer();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&topic, 0, Offset::Beginning)
        .expect("assign");
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 0;
    while next < RECORDS {
        assert!(Instant::now() < deadline, "consumed only {next} of {RECORDS}");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("a record");
        assert_eq!(message.offset(), next as i64, "offsets are dense");
        assert!(
            message.payload() == Some(&value(next)[..]),
            "record {next} differs from what was produced"
        );
        next += 1;
    }
}

/// Remote storage turned off with `remote.log.delete.on.disable=true`
/// (Kafka's KIP-950): the log start moves to the local start, the topic's
/// table and its files are deleted, what Redis holds is read as before, and
/// remote storage turned on again archives it into a new table. Two
/// gateways share the partitions (and the SQLite catalog and an S3
/// warehouse): each clears the partitions it leads, the one leading
/// partition 0 deletes the table and its objects.
#[test]
fn remote_storage_turned_off_deletes_the_archive() {
    use kafka_protocol::messages::IncrementalAlterConfigsRequest;
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::protocol::StrBytes;
    use ketch_tests::raw::{self, KafkaConn, code};

    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = dir.path().join("data");
    let s3 = S3Server::start(&dir.path().join("s3"), "lake");
    // The storage workers say at debug level why the drop waits.
    let settings = [
        s3.ketch_settings("warehouse"),
        vec!["log.level=info,ketch_tiering=debug".to_owned()],
    ]
    .concat();
    let ketch = tiered_gateway(&redis, &data_dir, &settings);
    let other = tiered_gateway(&redis, &data_dir, &settings);
    let rt = runtime();
    let topic = unique_topic("dropped");
    const P: usize = 4;
    create_remote_topic(
        &ketch,
        &rt,
        &topic,
        P as i32,
        &[
            ("segment.bytes", "65536"),
            ("segment.ms", "200"),
            ("local.retention.bytes", "0"),
        ],
    );
    let producer = ketch.producer_with(&[("linger.ms", "5")]);
    produce(&producer, &rt, &topic, P, 0..4_000);
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, P), [1_000; P]);
    let files_of_topic = || -> Vec<std::path::PathBuf> {
        walk(&s3.bucket_dir())
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(topic.as_str()))
            .collect()
    };
    let parquet = |files: &[std::path::PathBuf]| {
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .count()
    };
    assert!(parquet(&files_of_topic()) > 0, "archived: {:?}", files_of_topic());
    // The next records stay in Redis.
    set_topic_config(&ketch, &topic, "local.retention.bytes", "-1");
    produce(&producer, &rt, &topic, P, 4_000..6_000);

    // The storage worker of a third gateway, which read the topic while
    // remote storage was on, is still archiving partition 1 (it holds the
    // partition's archiving registration): the table must outlive it.
    let registration = format!("ketch:{{{}}}:archiving", redis.topic_tags(&topic)[1]);
    redis::cmd("SET")
        .arg(&registration)
        .arg("a-third-gateway")
        .arg("PX")
        .arg(300_000)
        .query::<()>(&mut redis.connection())
        .expect("SET");

    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        raw::set_topic_config(&mut conn, &topic, "remote.storage.enable", "false"),
        code::INVALID_CONFIG,
        "off without deleting the archive is refused (Kafka's rule)"
    );
    let op = |name: &str, value: &str| {
        AlterableConfig::default()
            .with_name(StrBytes::from_string(name.to_owned()))
            .with_config_operation(0)
            .with_value(Some(StrBytes::from_string(value.to_owned())))
    };
    let response = conn.request(
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.clone()))
                .with_configs(vec![
                    op("remote.storage.enable", "false"),
                    op("remote.log.delete.on.disable", "true"),
                ]),
        ]),
    );
    assert_eq!(
        response.responses[0].error_code,
        code::NONE,
        "{:?}",
        response.responses[0].error_message
    );
    let record = || -> String {
        redis::cmd("HGET")
            .arg("ketch:topics")
            .arg(&topic)
            .query(&mut redis.connection())
            .expect("topic record")
    };
    // Every partition has let go of the archive, and the drop waits for the
    // registration alone.
    let waits = "archive drop waits: a storage worker may still write the partition to the table";
    let deadline = Instant::now() + Duration::from_secs(60);
    while ![&ketch, &other].iter().any(|k| k.output().contains(waits)) {
        assert!(
            Instant::now() < deadline,
            "the drop never waited for the registration"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        parquet(&files_of_topic()) > 0 && record().contains("drop_archive"),
        "the table was purged while a worker could still write it: {:?}",
        files_of_topic()
    );
    redis::cmd("DEL")
        .arg(&registration)
        .query::<()>(&mut redis.connection())
        .expect("DEL");

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log_starts: Vec<i64> = (0..P)
            .map(|p| raw::list_offsets(&mut conn, &topic, p as i32, -2).1)
            .collect();
        let left = files_of_topic();
        if log_starts == [1_000; P] && left.is_empty() && !record().contains("drop_archive") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the archive was not dropped: log starts {log_starts:?}, files {left:?}, record {}",
            record()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Logged once the mark is cleared: it may come a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ![&ketch, &other]
        .iter()
        .any(|k| k.output().contains("deleted the topic's archive"))
    {
        assert!(Instant::now() < deadline, "no log line");
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in 0..P {
        assert_eq!(
            raw::list_offsets(&mut conn, &topic, p as i32, -4).1,
            1_000,
            "earliest local"
        );
        let response = conn.request(
            raw::FETCH_VERSION,
            &raw::fetch_request(&topic, p as i32, 999, 100),
        );
        assert_eq!(raw::fetch_result(&response).0, code::OFFSET_OUT_OF_RANGE);
        assert!(
            redis.segments(&topic, p).iter().all(|s| s.get("path").is_none()),
            "no segment names an archive file: {:?}",
            redis.segments(&topic, p)
        );
    }
    consume_and_check_from(&ketch.consumer(), &topic, &[1_000; P], &[1_500; P]);

    // On again: what Redis holds is archived into a new table, alone.
    set_topic_config(&ketch, &topic, "remote.storage.enable", "true");
    set_topic_config(&ketch, &topic, "local.retention.bytes", "0");
    assert_eq!(wait_all_trimmed(&redis, &ketch, &topic, P), [1_500; P]);
    consume_and_check_from(&ketch.consumer(), &topic, &[1_000; P], &[1_500; P]);
    let (catalog, _) = sqlite_catalog(&data_dir);
    pyiceberg_check(
        &catalog,
        "s3://lake/warehouse",
        Some(&s3),
        &topic,
        &[(1_000, 1_500); P],
        None,
    );
}

/// The archiving registration (`scripts/lease.lua`) that a purge of the
/// archive waits for: one worker holds it, another can neither take, renew
/// nor release it, and once it expires its holder cannot renew it (the
/// fence before a commit) until it takes it again.
#[test]
fn an_archiving_registration_has_one_holder_and_is_lost_when_it_expires() {
    let redis = TestRedis::start();
    let config = ketch_tests::store_config(&redis.url());
    runtime().block_on(async {
        use ketch_storage::segments::Lease;
        let store = ketch_storage::Store::new(&config).expect("store");
        let topic = store
            .create_topic(&unique_topic("registered"), 2, Default::default())
            .await
            .expect("created");
        let long = Duration::from_secs(60);
        let (a, b) = ("worker-a", "worker-b");
        assert!(!store.lease_held(Lease::Archiving, &topic, 0).await.unwrap());
        assert!(
            store
                .take_lease(Lease::Archiving, &topic, 0, a, long)
                .await
                .unwrap()
        );
        assert!(
            store
                .take_lease(Lease::Archiving, &topic, 0, a, long)
                .await
                .unwrap(),
            "taken again: renewed"
        );
        assert!(
            !store
                .take_lease(Lease::Archiving, &topic, 0, b, long)
                .await
                .unwrap(),
            "held by a"
        );
        assert!(
            !store
                .renew_lease(Lease::Archiving, &topic, 0, b, long)
                .await
                .unwrap()
        );
        assert!(
            store
                .renew_lease(Lease::Archiving, &topic, 0, a, long)
                .await
                .unwrap()
        );
        assert!(
            store
                .take_lease(Lease::Archiving, &topic, 1, b, long)
                .await
                .unwrap(),
            "per partition"
        );
        store.release_lease(Lease::Archiving, &topic, 0, b).await.unwrap();
        assert!(
            store.lease_held(Lease::Archiving, &topic, 0).await.unwrap(),
            "b cannot release a's"
        );
        store.release_lease(Lease::Archiving, &topic, 0, a).await.unwrap();
        assert!(!store.lease_held(Lease::Archiving, &topic, 0).await.unwrap());
        assert!(store.lease_held(Lease::Archiving, &topic, 1).await.unwrap());

        // Expired: the holder's renewal fails and does not take it back.
        assert!(
            store
                .take_lease(Lease::Archiving, &topic, 0, a, Duration::from_millis(50))
                .await
                .unwrap()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.lease_held(Lease::Archiving, &topic, 0).await.unwrap() {
            assert!(Instant::now() < deadline, "never expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !store
                .renew_lease(Lease::Archiving, &topic, 0, a, long)
                .await
                .unwrap()
        );
        assert!(!store.lease_held(Lease::Archiving, &topic, 0).await.unwrap());
        assert!(
            store
                .take_lease(Lease::Archiving, &topic, 0, b, long)
                .await
                .unwrap()
        );
    });
}

/// An archived segment whose record gives holes its data file does not
/// have (an older release recorded holes recomputed from Redis after
/// DeleteRecords moved into the segment) is read all the same: the reader
/// finds a row where the holes said it would not be, reads the holes off
/// the file and records them. Every read of the segment used to fail
/// (KAFKA_STORAGE_ERROR, retried by the client for ever).
#[test]
fn an_archived_segment_recorded_with_wrong_holes_is_read_and_its_record_mended() {
    use ketch_tests::raw::{self, code};

    let mut archived = archived_20("wrong-holes", |i| BASE_TIMESTAMP + i);
    let (redis, topic, conn) = (&archived.redis, archived.topic.clone(), &mut archived.conn);
    let segments = redis.segments(&topic, 0);
    let victim = segments
        .iter()
        .find(|s| s["last"].as_i64() > s["base"].as_i64())
        .expect("a segment of two records or more")
        .clone();
    let base = victim["base"].as_i64().unwrap();
    assert!(victim.get("holes").is_none(), "{victim}");
    let mut wrong = victim.clone();
    wrong["holes"] = serde_json::json!([[base, base]]);
    let key = format!("ketch:{{{}}}:segments", redis.topic_tags(&topic)[0]);
    let mut redis_conn = redis.connection();
    let _: i64 = redis::cmd("ZREMRANGEBYSCORE")
        .arg(&key)
        .arg(base)
        .arg(base)
        .query(&mut redis_conn)
        .expect("ZREMRANGEBYSCORE");
    let _: i64 = redis::cmd("ZADD")
        .arg(&key)
        .arg(base)
        .arg(wrong.to_string())
        .query(&mut redis_conn)
        .expect("ZADD");

    let response = conn.request(12, &raw::fetch_request(&topic, 0, base, 100));
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 20));
    let records = records.expect("records");
    assert!(raw::count_records(&records) > victim["last"].as_i64().unwrap() - base);
    assert_eq!(
        i64::from_be_bytes(records[0..8].try_into().unwrap()),
        base,
        "from the segment's first offset"
    );
    let mended = redis
        .segments(&topic, 0)
        .into_iter()
        .find(|s| s["base"].as_i64() == Some(base))
        .expect("the segment");
    assert!(
        mended
            .get("holes")
            .is_none_or(|h| h.as_array().is_some_and(Vec::is_empty)),
        "the file's holes recorded: {mended}"
    );
}

/// Each Redis server of `redis`: a connection to it.
fn every_server(redis: &TestRedis) -> Vec<redis::Connection> {
    match redis {
        TestRedis::Single(server) => vec![server.connection()],
        TestRedis::Cluster(cluster) => cluster.nodes.iter().map(|n| n.connection()).collect(),
    }
}

/// Sets every server's `maxmemory` to just under the memory it counts
/// against it now (`used_memory` less `mem_not_counted_for_evict`): full,
/// under `noeviction` refusing every write that may grow memory.
fn fill_to_the_brim(redis: &TestRedis) {
    for mut conn in every_server(redis) {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut conn)
            .expect("INFO memory");
        let field = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let counted = field("used_memory") - field("mem_not_counted_for_evict");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(counted - 1)
            .query(&mut conn)
            .expect("CONFIG SET maxmemory");
    }
}

/// A Redis full under `noeviction` is emptied by archiving, as
/// docs/observability.md says: the storage worker seals the open segment,
/// archives it, records it archived and trims it from Redis, all while
/// Redis refuses writes that grow memory; then appends go on. (Said, not
/// tested, until now: each script on that path must run at maxmemory.)
#[test]
fn a_full_redis_is_emptied_by_archiving_and_appends_go_on() {
    const RECORDS: usize = 6_000;
    const SEGMENT_BYTES: i64 = 262_144;
    let redis = TestRedis::start();
    let data = tempfile::tempdir().expect("temp dir");
    let rt = runtime();
    let topic = unique_topic("oom-archive");
    // A gateway that seals and archives nothing (its worker's first tick
    // is an hour away) fills the partition.
    let mut filler = tiered_gateway(
        &redis,
        data.path(),
        &[
            "tiering.tick_interval=1h".to_owned(),
            "tiering.lease_ttl=2h".to_owned(),
        ],
    );
    create_remote_topic(
        &filler,
        &rt,
        &topic,
        1,
        &[("segment.bytes", "262144"), ("local.retention.bytes", "0")],
    );
    produce(&filler.producer_with(&[]), &rt, &topic, 1, 0..RECORDS);
    assert!(redis.segments(&topic, 0).is_empty(), "nothing sealed yet");
    filler.terminate();
    filler
        .wait_exit(Duration::from_secs(20))
        .expect("the filler stops");

    fill_to_the_brim(&redis);
    // (In a Redis Cluster the masters not serving the key's slot answer
    // MOVED; its own refuses it.)
    let refusals: Vec<String> = every_server(&redis)
        .into_iter()
        .map(|mut conn| {
            let refused: redis::RedisResult<()> = redis::cmd("SET").arg("probe").arg("x").query(&mut conn);
            refused.expect_err("a write, Redis being full").to_string()
        })
        .collect();
    assert!(
        refusals.iter().any(|e| e.contains("OOM"))
            && refusals
                .iter()
                .all(|e| e.contains("OOM") || e.to_lowercase().contains("moved")),
        "{refusals:?}"
    );
    let ketch = tiered_gateway(&redis, data.path(), &[]);
    let producer = ketch.producer_with(&[("message.timeout.ms", "2000"), ("retries", "0")]);
    let send = || {
        rt.block_on(async {
            producer
                .send(
                    FutureRecord::<(), _>::to(&topic).payload("after").partition(0),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
        })
    };
    // Archived and trimmed while full...
    let local_start = wait_archived(&redis, &ketch, &topic, 1, true, SEGMENT_BYTES);
    assert_eq!(
        local_start,
        [RECORDS as i64],
        "the whole log archived and trimmed"
    );
    // ...which made room: appends go on.
    let deadline = Instant::now() + Duration::from_secs(30);
    let appended = loop {
        match send() {
            Ok(delivery) => break delivery,
            Err(e) => assert!(
                Instant::now() < deadline,
                "appends still refused after archiving: {e}"
            ),
        }
    };
    assert_eq!((appended.partition, appended.offset), (0, RECORDS as i64));
    for mut conn in every_server(&redis) {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(0)
            .query(&mut conn)
            .expect("CONFIG SET maxmemory");
    }
    consume_and_check(&ketch.consumer(), &topic, &[RECORDS as i64]);
}

/// A container credentials endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`,
/// as ECS gives; an instance role's IMDS is asked the same way) serving
/// `keys` with an expiry: its URL, and how many times it was asked.
fn credentials_endpoint(keys: (&str, &str)) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!(
        "http://127.0.0.1:{}/credentials",
        listener.local_addr().expect("address").port()
    );
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let body = serde_json::json!({
        "AccessKeyId": keys.0,
        "SecretAccessKey": keys.1,
        "Token": "session-token",
        "Expiration": "2100-01-01T00:00:00Z",
    })
    .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (endpoint, asked)
}

/// A gateway (`args`) whose only AWS credential source is `endpoint`: no
/// keys, profile files or instance metadata in its environment.
fn gateway_with_credentials_from(endpoint: &str, dir: &Path, redis: &TestRedis, args: &[String]) -> Ketch {
    let nowhere = dir.join("no-aws-files");
    let env = [
        format!("AWS_CONTAINER_CREDENTIALS_FULL_URI={endpoint}"),
        "AWS_EC2_METADATA_DISABLED=true".to_owned(),
        format!("AWS_CONFIG_FILE={}", nowhere.display()),
        format!("AWS_SHARED_CREDENTIALS_FILE={}", nowhere.display()),
    ];
    let mut wrapper = vec!["env"];
    for name in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    ] {
        wrapper.extend(["-u", name]);
    }
    wrapper.extend(env.iter().map(String::as_str));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Ketch::start_wrapped(&wrapper, &redis.url(), &args)
}

/// `s3`'s settings for a gateway, without its keys.
fn s3_settings_without_keys(s3: &S3Server, warehouse: &str) -> Vec<String> {
    s3.ketch_settings(warehouse)
        .into_iter()
        .filter(|s| {
            !s.starts_with("tiering.s3_access_key_id") && !s.starts_with("tiering.s3_secret_access_key")
        })
        .collect()
}

/// With no S3 keys in its settings, a gateway takes its credential from
/// the environment: here a container credentials endpoint, as ECS gives
/// (an instance role's IMDS is asked the same way). It asks once for all
/// of its S3 operations while the credential is valid (archiving three
/// segments into the table and reading them back from the archive), not
/// once per operation.
#[test]
fn a_credential_from_the_environment_is_asked_for_once_not_per_s3_operation() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let s3 = S3Server::start(&dir.path().join("s3"), "lake");
    let (endpoint, asked) = credentials_endpoint((S3_ACCESS_KEY, S3_SECRET_KEY));
    let data_dir = dir.path().join("data");
    let mut args = Vec::new();
    set(&mut args, "tiering.tick_interval=100ms".to_owned());
    set(&mut args, format!("tiering.data_dir={}", data_dir.display()));
    for setting in s3_settings_without_keys(&s3, "warehouse") {
        set(&mut args, setting);
    }
    let ketch = gateway_with_credentials_from(&endpoint, dir.path(), &redis, &args);

    let (topic, local_start, end) = archive_three_segments(&ketch, &redis, "role-credentials", 9000);
    assert!(local_start > 0);
    consume_and_check(&ketch.consumer(), &topic, &[end]);
    assert!(metric(&ketch, "ketch_archive_segments_total") >= 3.0);
    assert!(metric(&ketch, "ketch_remote_read_bytes_total") > 0.0);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the credential endpoint asked once for every S3 operation"
    );
}

/// The same through a REST catalog, whose tables' files the gateway
/// writes through the file IO the catalog's answer configures: a table
/// the catalog vends no keys for takes the environment's credential, asked
/// once for every operation; one it vends keys for is written with those
/// keys, whatever the environment's credential (here one the object store
/// refuses).
#[test]
fn a_rest_catalogs_tables_take_the_environments_credential_once_or_the_vended_keys() {
    use std::sync::atomic::Ordering;
    for vended in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let redis = TestRedis::start();
        let s3 = S3Server::start(&dir.path().join("s3"), "lake");
        let environment_keys = if vended {
            ("AKIDWRONGWRONGWRONG", "not-the-secret")
        } else {
            (S3_ACCESS_KEY, S3_SECRET_KEY)
        };
        let (endpoint, asked) = credentials_endpoint(environment_keys);
        // The catalog writes tables' metadata with the object store's keys.
        let mut options: Vec<String> = [
            format!("s3.endpoint={}", s3.endpoint()),
            "s3.region=us-east-1".to_owned(),
            format!("s3.access-key-id={S3_ACCESS_KEY}"),
            format!("s3.secret-access-key={S3_SECRET_KEY}"),
        ]
        .iter()
        .flat_map(|prop| ["--prop".to_owned(), prop.clone()])
        .collect();
        if vended {
            for prop in [
                format!("s3.access-key-id={S3_ACCESS_KEY}"),
                format!("s3.secret-access-key={S3_SECRET_KEY}"),
            ] {
                options.extend(["--vend".to_owned(), prop]);
            }
        }
        let catalog =
            RestCatalog::start_with(&dir.path().join("rest/catalog.db"), "s3://lake/rest", &options);
        let data_dir = dir.path().join("data");
        let mut args = Vec::new();
        set(&mut args, "tiering.tick_interval=100ms".to_owned());
        set(&mut args, format!("tiering.data_dir={}", data_dir.display()));
        set(&mut args, "tiering.catalog=rest".to_owned());
        set(&mut args, format!("tiering.catalog_uri={}", catalog.url()));
        for setting in s3_settings_without_keys(&s3, "rest") {
            set(&mut args, setting);
        }
        let ketch = gateway_with_credentials_from(&endpoint, dir.path(), &redis, &args);

        let prefix = if vended { "rest-vended" } else { "rest-role" };
        let (topic, local_start, end) = archive_three_segments(&ketch, &redis, prefix, 9000);
        assert!(local_start > 0);
        assert!(metric(&ketch, "ketch_archive_segments_total") >= 3.0);
        if vended {
            // Three partitions archive in a tick, committing one after
            // another to the topic's table: each commit, and the table's
            // upkeep after it, keeps the vended keys (the catalog's answer
            // to a commit carries a file IO without them).
            let wide = unique_topic("rest-vended-wide");
            let rt = runtime();
            create_remote_topic(
                &ketch,
                &rt,
                &wide,
                3,
                &[("segment.bytes", "65536"), ("local.retention.bytes", "0")],
            );
            let producer = ketch.producer_with(&[("linger.ms", "5")]);
            produce(&producer, &rt, &wide, 3, 0..6000);
            wait_archived(&redis, &ketch, &wide, 3, true, 65536);
            assert_eq!(
                metric(&ketch, "ketch_archive_failures_total"),
                0.0,
                "an archive attempt failed: the vended keys were not used\n{}",
                ketch.output()
            );
            // The gateway's own reads of the archive take its settings'
            // credential, the environment's: refused here.
            continue;
        }
        consume_and_check(&ketch.consumer(), &topic, &[end]);
        assert!(metric(&ketch, "ketch_remote_read_bytes_total") > 0.0);
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "the credential endpoint asked once for every S3 operation"
        );
    }
}

/// While the object store refuses its writes, a topic's archiving backs
/// off: after each failure in a row its next attempt waits twice as long
/// (from one tick, at most 64), instead of failing on every tick.
#[test]
fn archiving_backs_off_while_the_object_store_refuses_it() {
    use ketch_tests::batch::{self, Record};
    use ketch_tests::raw::{self, KafkaConn, code};
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let s3 = S3Server::start(&dir.path().join("s3"), "lake");
    let ketch = tiered_gateway(&redis, &dir.path().join("data"), &s3.ketch_settings("warehouse"));
    let topic = unique_topic("backoff");
    create_remote_topic(&ketch, &runtime(), &topic, 1, &[("segment.ms", "200")]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let produce = |conn: &mut KafkaConn, i: i64| {
        let batch = batch::encode(&[Record::value(BASE_TIMESTAMP + i, b"v")]);
        assert_eq!(raw::produce(conn, &topic, 0, batch).0, code::NONE);
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "{what}\n{}", ketch.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The table exists, a segment archived.
    produce(&mut conn, 0);
    until("nothing archived", &|| {
        metric(&ketch, "ketch_archive_segments_total") >= 1.0
    });
    // The bucket goes away (the store answers NoSuchBucket at once, where
    // a store that is down is retried inside each attempt); segments keep
    // sealing.
    std::fs::rename(s3.root().join("lake"), s3.root().join("gone")).expect("move the bucket away");
    produce(&mut conn, 1);
    let failures = || metric(&ketch, "ketch_archive_failures_total");
    until("archiving never failed", &|| failures() >= 3.0);
    let third = Instant::now();
    until("archiving stopped trying", &|| failures() >= 7.0);
    // Failing every tick (100 ms), four more failures take 0.4 s; backing
    // off, 0.4 + 0.8 + 1.6 + 3.2 s.
    let took = third.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "four failures in {took:?}: no backoff"
    );
    eprintln!("four failures in a row took {took:?}");
}

/// A read that takes several Redis round trips is not left with a gap when
/// local retention trims the log between two of them: the records trimmed
/// are archived, and the read stops at what it has (the next fetch from
/// there is served from the archive), where before it went on from the new
/// local start, and consumers, which take a gap for compaction, stepped
/// over the trimmed records. A proxy holds the read's second round back
/// while the test trims, as the storage worker's local retention does.
#[test]
fn a_read_across_a_local_trim_stops_at_the_trim_instead_of_leaving_a_gap() {
    use bytes::Bytes;
    use ketch_storage::{ReadRequest, StorageError, Store};
    use ketch_tests::batch::{self, Record};
    use ketch_tests::proxy::DelayProxy;
    let redis = TestRedis::Single(ketch_tests::RedisServer::start());
    let TestRedis::Single(server) = &redis else {
        unreachable!()
    };
    let proxy = DelayProxy::start(([127, 0, 0, 1], server.port()).into(), Duration::ZERO);
    let config = ketch_tests::store_config(&proxy.redis_url());
    let rt = runtime();
    let _entered = rt.enter();
    let store = Store::new(&config).expect("store");
    let name = unique_topic("trimmed-mid-read");
    let topic = rt
        .block_on(store.create_topic(&name, 1, Default::default()))
        .expect("create");
    for offset in 0..50 {
        let bytes = batch::encode(&[Record::value(batch::at(offset), b"record")]);
        let header = ketch_storage::batch::header(&bytes).expect("header");
        rt.block_on(store.append(&topic, 0, &Bytes::from(bytes), &header, false))
            .expect("append");
    }
    let request = ReadRequest {
        offset: 0,
        max_bytes: 1 << 20,
        max_batch_bytes: 1 << 20,
        read_cap: 1 << 20,
    };
    // The first round reads a few batches of a partition it knows nothing
    // of; the second is held.
    proxy.hold_requests(b"XRANGE", 1);
    let read = {
        let (store, topic) = (store.clone(), topic.clone());
        rt.spawn(async move { store.read(&topic, 0, &request).await })
    };
    assert!(proxy.await_held(Duration::from_secs(20)), "no second round");
    // Local retention: the log below offset 20 is archived and trimmed.
    redis.set_meta(&name, 0, &[("local_start", "20")]);
    let log = redis.partition_key(&name, 0, "log");
    let _: i64 = redis::cmd("XTRIM")
        .arg(&log)
        .arg("MINID")
        .arg("20")
        .query(&mut redis.connection())
        .expect("XTRIM");
    proxy.release();
    let read = rt.block_on(read).expect("the read's task").expect("read");
    let mut expected = 0;
    for batch in &read.batches {
        let base = i64::from_be_bytes(batch[..8].try_into().unwrap());
        assert_eq!(base, expected, "a gap in the batches read");
        let header = ketch_storage::batch::header(batch).expect("header");
        expected = base + i64::from(header.last_offset_delta) + 1;
    }
    assert!(
        (1..20).contains(&expected),
        "stopped at the trim, read up to {expected}"
    );
    // Where it stopped, the next read is told to go to the archive.
    let next = ReadRequest {
        offset: expected,
        ..request
    };
    assert!(matches!(
        rt.block_on(store.read(&topic, 0, &next)),
        Err(StorageError::NotLocal { .. })
    ));
}

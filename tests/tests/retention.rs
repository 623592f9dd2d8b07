//! The storage worker (DESIGN §7): segments sealed on `segment.bytes` and
//! `segment.ms`, retention by bytes and by time for topics without remote
//! storage, and one lease per partition.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, runtime, unique_topic};
use rdkafka::consumer::Consumer;

const WORKER: [&str; 4] = [
    "--set",
    "tiering.tick_interval=100ms",
    "--set",
    "tiering.lease_ttl=1s",
];

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Polls ListOffsets earliest until `done` holds: retention runs on the
/// worker's ticks, and the log start offset is how a client sees it.
fn wait_for_log_start(conn: &mut KafkaConn, topic: &str, what: &str, done: impl Fn(i64) -> bool) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (error, earliest, _) = raw::list_offsets(conn, topic, 0, -2);
        assert_eq!(error, code::NONE);
        if done(earliest) {
            return earliest;
        }
        assert!(Instant::now() < deadline, "{what}: log start still {earliest}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until partition 0 of `topic` has sealed every record below
/// `offset` (its open segment starts there).
fn await_sealed_below(redis: &TestRedis, topic: &str, offset: i64) {
    let meta_key = format!("ketch:{{{}}}:meta", redis.topic_tags(topic)[0]);
    let mut r = redis.connection();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let open_base: Option<i64> = redis::cmd("HGET")
            .arg(&meta_key)
            .arg("seg_base")
            .query(&mut r)
            .unwrap();
        if open_base == Some(offset) {
            return;
        }
        assert!(Instant::now() < deadline, "the segment was never sealed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until a storage-worker pass over partition 0 of `topic` that
/// began after this call has finished (its seal and retention), so that a
/// test may assert what the pass left: the partition's lease, deleted here,
/// is taken again by the next pass before it seals; deleted again, by the
/// pass after, which begins once that one is done.
fn await_worker_pass(redis: &TestRedis, topic: &str) {
    let lease = format!("ketch:{{{}}}:lease", redis.topic_tags(topic)[0]);
    let mut r = redis.connection();
    for _ in 0..2 {
        let _: i64 = redis::cmd("DEL").arg(&lease).query(&mut r).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !redis::cmd("EXISTS").arg(&lease).query::<bool>(&mut r).unwrap() {
            assert!(Instant::now() < deadline, "no worker pass took the lease again");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Retention by bytes deletes whole sealed segments, and the time index
/// entries below the new log start with them.
#[test]
fn retention_bytes_deletes_whole_sealed_segments() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &WORKER);
    let topic = unique_topic("retention-bytes");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("segment.bytes", "2000"), ("retention.bytes", "6000")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut r = redis.connection();
    let segments_key = format!("ketch:{{{}}}:segments", redis.topic_tags(&topic)[0]);
    // Segments are sealed on the worker's ticks: produce four batches
    // (~2,080 bytes, over segment.bytes), then wait for the seal.
    for round in 0..10 {
        for i in round * 4..round * 4 + 4 {
            let value = vec![b'a' + (i % 26) as u8; 450];
            let (error, offset) = raw::produce(
                &mut conn,
                &topic,
                0,
                batch::encode(&[Record::value(now_ms(), &value)]),
            );
            assert_eq!((error, offset), (code::NONE, i64::from(i)));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let sealed: i64 = redis::cmd("ZCARD").arg(&segments_key).query(&mut r).unwrap();
            let start = raw::list_offsets(&mut conn, &topic, 0, -2).1;
            // Sealed segments so far: those kept plus those deleted (4 offsets each).
            if sealed + start / 4 > i64::from(round) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {sealed} segments sealed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // 40 batches of ~520 bytes: four per sealed segment, so at most the
    // open segment plus the segments that keep the rest >= 6000 bytes stay.
    let earliest = wait_for_log_start(&mut conn, &topic, "retention.bytes", |start| start >= 24);
    assert!(earliest < 40, "the newest records stay");
    assert_eq!(earliest % 4, 0, "the log starts at a segment boundary");
    assert_eq!(
        redis.stream_len(&topic, 0),
        40 - earliest,
        "Redis holds exactly the retained batches"
    );
    // Nor does the time index keep entries below the log start (its first,
    // at offset 0, among them): it grew with everything ever written.
    let times_key = format!("ketch:{{{}}}:times", redis.topic_tags(&topic)[0]);
    let indexed: Vec<i64> = redis::cmd("ZRANGE")
        .arg(&times_key)
        .arg(0)
        .arg(-1)
        .query(&mut r)
        .unwrap();
    assert!(
        indexed.iter().all(|offset| *offset >= earliest),
        "time index entries below the log start {earliest}: {indexed:?}"
    );

    let (error, _, _) =
        raw::fetch_result(&conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 1 << 20)));
    assert_eq!(error, code::OFFSET_OUT_OF_RANGE, "below the log start");
    let response = conn.request(
        raw::FETCH_VERSION,
        &raw::fetch_request(&topic, 0, earliest, 1 << 20),
    );
    assert_eq!(raw::fetch_result(&response).0, code::NONE, "from the log start");
}

#[test]
fn retention_ms_deletes_segments_whose_records_are_old() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &WORKER);
    let topic = unique_topic("retention-ms");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("segment.ms", "200"), ("retention.ms", "60000")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let hour_ago = now_ms() - 3_600_000;
    for i in 0..5 {
        let batch = batch::encode(&[Record::value(hour_ago + i, b"old")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, batch).0, code::NONE);
    }
    // Sealed after segment.ms, then deleted: every record is an hour old.
    wait_for_log_start(&mut conn, &topic, "retention.ms", |start| start == 5);
    assert_eq!(redis.stream_len(&topic, 0), 0);
    // New records are kept.
    let batch = batch::encode(&[Record::value(now_ms(), b"new")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, batch), (code::NONE, 5));
    // Its segment sealed (segment.ms) and gone through retention since.
    await_sealed_below(&redis, &topic, 6);
    await_worker_pass(&redis, &topic);
    assert_eq!(raw::list_offsets(&mut conn, &topic, 0, -2).1, 5);
}

/// A Redis at maxmemory (`noeviction`: every write that may grow memory is
/// refused) is still emptied by retention and DeleteRecords, as Kafka
/// deletes segments from a full disk: the scripts that free memory run
/// under OOM (their first write, the seal's segment record or the new log
/// start, used to be refused with the whole script, so nothing was ever
/// freed and producers failed until an operator stepped in).
#[test]
fn a_full_redis_is_emptied_by_retention_and_delete_records() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &WORKER);
    let topic = unique_topic("retention-full");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("segment.ms", "86400000"), ("retention.ms", "3000")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for _ in 0..6 {
        let batch = batch::encode(&[Record::value(now_ms(), b"kept until full")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, batch).0, code::NONE);
    }
    redis.config_set("maxmemory", "1");
    let refused = batch::encode(&[Record::value(now_ms(), b"no room")]);
    const KAFKA_STORAGE_ERROR: i16 = 56;
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, refused).0,
        KAFKA_STORAGE_ERROR,
        "Redis is full"
    );
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 2), (code::NONE, 2));
    // The open segment's records age past retention.ms: sealed and deleted.
    wait_for_log_start(&mut conn, &topic, "retention under maxmemory", |start| start == 6);
    assert_eq!(redis.stream_len(&topic, 0), 0);
    redis.config_set("maxmemory", "0");
}

/// The open segment goes once its records are past retention.ms, as Kafka
/// rolls and deletes an active segment: an idle partition's last records
/// do not wait for segment.ms (a day here) to be sealed.
#[test]
fn retention_ms_deletes_the_open_segment_too() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &WORKER);
    let topic = unique_topic("retention-open");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("segment.ms", "86400000"), ("retention.ms", "60000")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let hour_ago = now_ms() - 3_600_000;
    for i in 0..3 {
        let batch = batch::encode(&[Record::value(hour_ago + i, b"old")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, batch).0, code::NONE);
    }
    wait_for_log_start(&mut conn, &topic, "the open segment's retention", |start| {
        start == 3
    });
    assert_eq!(redis.stream_len(&topic, 0), 0);
    // A new record is kept (its segment is young).
    let batch = batch::encode(&[Record::value(now_ms(), b"new")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, batch), (code::NONE, 3));
    await_worker_pass(&redis, &topic);
    assert_eq!(raw::list_offsets(&mut conn, &topic, 0, -2).1, 3);
}

/// A segment whose records carry no timestamp (-1) ages from when it was
/// sealed (Kafka: from its file's last write), not from the epoch: it is
/// kept for retention.ms (it was deleted as soon as it was sealed).
#[test]
fn records_without_a_timestamp_are_kept_for_the_retention() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &WORKER);
    let topic = unique_topic("retention-untimed");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("segment.ms", "200"), ("retention.ms", "60000")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for _ in 0..3 {
        let batch = batch::encode(&[Record::value(-1, b"untimed")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, batch).0, code::NONE);
    }
    await_sealed_below(&redis, &topic, 3);
    await_worker_pass(&redis, &topic);
    assert_eq!(raw::list_offsets(&mut conn, &topic, 0, -2).1, 0, "log start");
    assert_eq!(redis.stream_len(&topic, 0), 3);
}

/// The worker id holding each partition's lease (`ketch:{TAG}:lease`).
fn lease_holders(redis: &TestRedis, topic: &str) -> Vec<Option<String>> {
    let mut r = redis.connection();
    redis
        .topic_tags(topic)
        .iter()
        .map(|tag| {
            redis::cmd("GET")
                .arg(format!("ketch:{{{tag}}}:lease"))
                .query(&mut r)
                .unwrap()
        })
        .collect()
}

#[test]
fn one_gateway_holds_each_partitions_lease() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &[&["--node-id", "1"][..], &WORKER].concat());
    let b = Ketch::start(&redis.url(), &[&["--node-id", "2"][..], &WORKER].concat());
    // Partitions are placed by hashing the topic's random id: in one topic
    // of 128, all 8 land on one gateway, and this test needs both. Topics
    // are made until one spreads over both, as Metadata reports once the
    // gateways see each other.
    let deadline = Instant::now() + Duration::from_secs(20);
    let leaders = |topic: &str| -> (usize, std::collections::BTreeSet<i32>) {
        let metadata = a
            .consumer()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let leaders = metadata.topics()[0]
            .partitions()
            .iter()
            .map(|p| p.leader())
            .collect();
        (metadata.brokers().len(), leaders)
    };
    let topic = loop {
        let topic = unique_topic("leases");
        a.create_topic(&runtime(), &topic, 8);
        let (brokers, led_by) = loop {
            let (brokers, led_by) = leaders(&topic);
            if brokers == 2 {
                break (brokers, led_by);
            }
            assert!(Instant::now() < deadline, "the gateways never saw each other");
            std::thread::sleep(Duration::from_millis(50));
        };
        if led_by.len() == brokers {
            break topic;
        }
    };
    // Each partition's lease ends with its leader's worker (one taken
    // before the gateways saw each other passes once its holder stops
    // renewing it).
    loop {
        let holders = lease_holders(&redis, &topic);
        let distinct: std::collections::BTreeSet<&String> = holders.iter().flatten().collect();
        if holders.iter().all(Option::is_some) && distinct.len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both gateways' workers should hold some of the 8 leases: {holders:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((a, b));
}

/// A lease passes to the partition's new leader at once, not after
/// `tiering.lease_ttl`: a gateway releases the leases of the partitions it
/// stops leading when another joins, and all of its leases when it stops.
#[test]
fn leases_pass_to_the_new_leader_without_waiting_for_them_to_expire() {
    // Far longer than the test may take: a lease that only expired would fail it.
    let worker = [
        "--set",
        "tiering.tick_interval=100ms",
        "--set",
        "tiering.lease_ttl=300s",
    ];
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &[&["--node-id", "1"][..], &worker].concat());
    let topic = unique_topic("handover");
    a.create_topic(&runtime(), &topic, 8);
    let wait_for = |what: &str, done: &dyn Fn(&[Option<String>]) -> bool| -> Vec<Option<String>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = lease_holders(&redis, &topic);
            if done(&now) {
                return now;
            }
            assert!(Instant::now() < deadline, "{what}: {now:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let distinct = |h: &[Option<String>]| {
        h.iter()
            .flatten()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let alone = wait_for("the only gateway should lease every partition", &|h| {
        h.iter().all(Option::is_some) && distinct(h) == 1
    });
    let a_worker = alone[0].clone();

    let mut b = Ketch::start(&redis.url(), &[&["--node-id", "2"][..], &worker].concat());
    wait_for(
        "the first gateway should release the partitions the second now leads",
        &|h| h.iter().all(Option::is_some) && distinct(h) == 2,
    );

    b.terminate();
    let status = b.wait_exit(Duration::from_secs(30)).expect("the gateway stops");
    assert!(status.success(), "{status:?}\n{}", b.output());
    assert!(b.logs("storage worker stopped"), "{}", b.output());
    wait_for("the stopped gateway's leases should pass back at once", &|h| {
        h.iter().all(|holder| *holder == a_worker)
    });
    drop(a);
}

/// The storage worker's per-tick scripts over a partition with hundreds of
/// segment records (a remote topic's archived segments pile up): they read
/// the records a chunk at a time, as far as the call needs, and still
/// apply retention.ms, retention.bytes and local retention across chunks,
/// find an unsettled segment deep below the local start for the aborted
/// index's trim bound, and archiving's listing leaves out the segments
/// below the local start only while none of them can want work.
#[test]
fn the_worker_reads_many_segment_records_a_chunk_at_a_time_with_the_same_outcome() {
    use ketch_storage::segments::SegmentPolicy;
    const SEGMENTS: i64 = 600;
    let redis = TestRedis::start();
    let config = ketch_tests::store_config(&redis.url());
    let rt = runtime();
    // The store's connections start tasks on the runtime.
    let _entered = rt.enter();
    let store = ketch_storage::Store::new(&config).expect("store");
    let name = unique_topic("many-segments");
    let topic = rt
        .block_on(store.create_topic(&name, 4, Default::default()))
        .expect("create");
    let now = now_ms();
    let old = now - 7_200_000;
    // 600 archived segments of 10 offsets and 100 bytes each; `extra`
    // rewrites one's fields.
    let fill = |partition: usize,
                local_start: i64,
                expired_below: i64,
                extra: &dyn Fn(i64, &mut serde_json::Value)| {
        let mut conn = redis.connection();
        let key = redis.partition_key(&name, partition, "segments");
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&key);
        for i in 0..SEGMENTS {
            let base = i * 10;
            let ts = if i < expired_below { old } else { now };
            let mut segment = serde_json::json!({
                "base": base, "last": base + 9, "bytes": 100, "max_ts": ts, "sealed_ms": ts,
                "path": format!("s3://warehouse/t/data/{base:020}.parquet"), "file_bytes": 50,
            });
            extra(i, &mut segment);
            zadd.arg(base).arg(segment.to_string());
        }
        let () = zadd.query(&mut conn).expect("ZADD");
        let end = (SEGMENTS * 10).to_string();
        redis.set_meta(
            &name,
            partition,
            &[
                ("next_offset", end.as_str()),
                ("log_start", "0"),
                ("local_start", &local_start.to_string()),
                ("seg_base", end.as_str()),
                ("seg_bytes", "0"),
            ],
        );
    };
    let policy = SegmentPolicy {
        segment_bytes: 1 << 30,
        segment_ms: 604_800_000,
        retention_ms: -1,
        retention_bytes: -1,
        remote: true,
        no_archive: false,
        local_retention_ms: -1,
        local_retention_bytes: -1,
        producer_expiration_ms: 604_800_000,
    };
    let seal = |partition: i32, policy: SegmentPolicy| {
        rt.block_on(store.seal_and_retain(&topic, partition, policy))
            .expect("seal")
    };
    let count = |partition: usize| redis.segments(&name, partition).len() as i64;

    // retention.ms: the 400 oldest are past it, all below the local start.
    fill(0, SEGMENTS * 10, 400, &|_, _| {});
    let outcome = seal(
        0,
        SegmentPolicy {
            retention_ms: 3_600_000,
            ..policy
        },
    );
    assert_eq!((outcome.deleted, outcome.log_start_offset), (400, 4000));
    assert_eq!(count(0), SEGMENTS - 400);

    // retention.bytes: the total of all 600 (60000 B) counts; the oldest go
    // while the rest still holds 25000 B.
    fill(1, SEGMENTS * 10, 0, &|_, _| {});
    let outcome = seal(
        1,
        SegmentPolicy {
            retention_bytes: 25_000,
            ..policy
        },
    );
    assert_eq!((outcome.deleted, outcome.log_start_offset), (350, 3500));
    assert_eq!(count(1), 250);

    // local.retention.bytes: all 600 in Redis (local start 0), trimmed
    // until the rest holds 10000 B; nothing leaves the log.
    fill(2, 0, 0, &|_, _| {});
    let outcome = seal(
        2,
        SegmentPolicy {
            local_retention_bytes: 10_000,
            ..policy
        },
    );
    assert_eq!((outcome.deleted, outcome.local_start_offset), (0, 5000));
    assert_eq!(count(2), SEGMENTS);

    // The aborted index's trim bound stops at the first segment below the
    // local start that is not settled: a quarantined one at offset 5200.
    // Skipped segments before it are settled, whatever their reasons say.
    // Records are read from the segment holding the quarantine stream's
    // oldest batch on (none below has a copy there): the one at offset 10,
    // which would stop the bound were it read (no segment below the local
    // start is left unsettled without a copy), is not.
    fill(3, SEGMENTS * 10, 0, &|i, segment| {
        if i == 1 {
            segment.as_object_mut().expect("object").remove("path");
        }
        if i % 7 == 3 {
            segment.as_object_mut().expect("object").remove("path");
            segment["skipped"] = serde_json::json!({
                "reason": "\"quarantine\": {} \"purge\": true", "at": 1, "error": "\"path\":",
            });
        }
        if i == 520 {
            segment["quarantine"] = serde_json::json!({"reason": "unreadable", "at": 1, "retry": false});
        }
    });
    // Its batches are in the quarantine stream, as a quarantined segment's
    // are, after a copy of the archived segment at 30 (left behind).
    let mut conn = redis.connection();
    let quarantine = redis.partition_key(&name, 3, "quarantine");
    for id in ["35-1", "5209-10"] {
        let _: String = redis::cmd("XADD")
            .arg(&quarantine)
            .arg(id)
            .arg("b")
            .arg("a quarantined batch")
            .query(&mut conn)
            .expect("XADD");
    }
    seal(3, policy);
    assert_eq!(
        redis.meta_field(&name, 3, "abt_to").as_deref(),
        Some("5200"),
        "proposed up to the quarantined segment"
    );
    // Once it is archived, the bound is the local start: found by reading
    // the records while its copy is still in the quarantine stream, and at
    // once when the stream is empty.
    let key = redis.partition_key(&name, 3, "segments");
    let () = redis::cmd("ZREMRANGEBYSCORE")
        .arg(&key)
        .arg(5200)
        .arg(5200)
        .query(&mut conn)
        .expect("ZREMRANGEBYSCORE");
    let archived = serde_json::json!({"base": 5200, "last": 5209, "bytes": 100, "max_ts": now,
        "sealed_ms": now, "path": "s3://warehouse/t/data/5200.parquet", "file_bytes": 50});
    let () = redis::cmd("ZADD")
        .arg(&key)
        .arg(5200)
        .arg(archived.to_string())
        .query(&mut conn)
        .expect("ZADD");
    redis::cmd("HDEL")
        .arg(redis.partition_key(&name, 3, "meta"))
        .arg("abt_at")
        .query::<i64>(&mut conn)
        .expect("HDEL");
    seal(3, policy);
    assert_eq!(redis.meta_field(&name, 3, "abt_to").as_deref(), Some("6000"));
    let _: i64 = redis::cmd("DEL").arg(&quarantine).query(&mut conn).expect("DEL");
    redis.set_meta(&name, 3, &[("abt_to", "0")]);
    let _: i64 = redis::cmd("HDEL")
        .arg(redis.partition_key(&name, 3, "meta"))
        .arg("abt_at")
        .query(&mut conn)
        .expect("HDEL");
    seal(3, policy);
    assert_eq!(redis.meta_field(&name, 3, "abt_to").as_deref(), Some("6000"));

    // Archiving's listing: below the local start only when asked for all,
    // or from the segment holding the quarantine stream's oldest batch
    // when it holds batches (a segment from there on may want work).
    let listing = |partition: i32, all: bool| {
        rt.block_on(store.archive_listing(&topic, partition, all))
            .expect("listing")
    };
    redis.set_meta(&name, 2, &[("local_start", "5005")]);
    let partial = listing(2, false);
    assert!(!partial.complete);
    assert_eq!(
        partial.segments.iter().map(|s| s.base).collect::<Vec<_>>(),
        (500..SEGMENTS).map(|i| i * 10).collect::<Vec<_>>(),
        "from the segment holding the local start on"
    );
    let all = listing(2, true);
    assert!(all.complete);
    assert_eq!(all.segments.len() as i64, SEGMENTS);
    let _: String = redis::cmd("XADD")
        .arg(redis.partition_key(&name, 2, "quarantine"))
        .arg("215-1")
        .arg("b")
        .arg("a quarantined batch")
        .query(&mut conn)
        .expect("XADD");
    let with_quarantine = listing(2, false);
    assert!(with_quarantine.complete);
    assert_eq!(
        with_quarantine
            .segments
            .iter()
            .map(|s| s.base)
            .collect::<Vec<_>>(),
        (21..SEGMENTS).map(|i| i * 10).collect::<Vec<_>>(),
        "from the segment holding the oldest quarantined batch on"
    );
    assert_eq!(with_quarantine.log_start_offset, 0);
}

/// retention.bytes needs the sealed segments' total: the worker keeps it
/// in the partition's meta as it seals and deletes segments, and sums
/// every record again only when the segments changed in a way it did not
/// follow (a gateway of an older release sealed or deleted one), not on
/// every call of a topic that keeps a record per archived segment.
#[test]
fn retention_bytes_keeps_the_sealed_total_instead_of_reading_every_record() {
    use ketch_storage::segments::SegmentPolicy;
    const SEGMENTS: i64 = 600;
    let redis = TestRedis::start();
    let config = ketch_tests::store_config(&redis.url());
    let rt = runtime();
    let _entered = rt.enter();
    let store = ketch_storage::Store::new(&config).expect("store");
    let name = unique_topic("sealed-total");
    let topic = rt
        .block_on(store.create_topic(&name, 1, Default::default()))
        .expect("create");
    let now = now_ms();
    let mut conn = redis.connection();
    let key = redis.partition_key(&name, 0, "segments");
    let record = |base: i64, bytes: i64| {
        serde_json::json!({
            "base": base, "last": base + 9, "bytes": bytes, "max_ts": now, "sealed_ms": now,
            "path": format!("s3://warehouse/t/data/{base:020}.parquet"), "file_bytes": 50,
        })
        .to_string()
    };
    // 600 archived segments of 10 offsets and 100 bytes each, all below
    // the local start.
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(&key);
    for i in 0..SEGMENTS {
        zadd.arg(i * 10).arg(record(i * 10, 100));
    }
    let () = zadd.query(&mut conn).expect("ZADD");
    let end = (SEGMENTS * 10).to_string();
    redis.set_meta(
        &name,
        0,
        &[
            ("next_offset", end.as_str()),
            ("log_start", "0"),
            ("local_start", end.as_str()),
            ("seg_base", end.as_str()),
            ("seg_bytes", "0"),
        ],
    );
    let policy = SegmentPolicy {
        segment_bytes: 1 << 30,
        segment_ms: 604_800_000,
        retention_ms: -1,
        retention_bytes: 100_000,
        remote: true,
        no_archive: false,
        local_retention_ms: -1,
        local_retention_bytes: -1,
        producer_expiration_ms: 604_800_000,
    };
    let seal = |policy: SegmentPolicy| {
        rt.block_on(store.seal_and_retain(&topic, 0, policy))
            .expect("seal")
    };
    let total = || redis.meta_field(&name, 0, "sealed_bytes");

    // The first call sums every record: 60000 B, under the limit.
    assert_eq!(seal(policy).deleted, 0);
    assert_eq!(total().as_deref(), Some("60000"));

    // A record's size changed behind the worker's back (no writer does
    // that; the archive's state changes leave sizes as they are): the
    // worker does not read it, the kept total stands.
    let rewrite = |base: i64, bytes: i64| {
        let mut conn = redis.connection();
        let () = redis::cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg(base)
            .arg(base)
            .query(&mut conn)
            .expect("ZREMRANGEBYSCORE");
        let () = redis::cmd("ZADD")
            .arg(&key)
            .arg(base)
            .arg(record(base, bytes))
            .query(&mut conn)
            .expect("ZADD");
    };
    rewrite(3000, 1_000_000);
    assert_eq!(seal(policy).deleted, 0, "every record was read again");
    assert_eq!(total().as_deref(), Some("60000"));

    // The worker seals the open segment (700 B): counted in.
    redis.set_meta(&name, 0, &[("next_offset", "6010"), ("seg_bytes", "700")]);
    let sealed = seal(SegmentPolicy {
        segment_bytes: 500,
        ..policy
    });
    assert_eq!((sealed.sealed, sealed.deleted), (1, 0));
    assert_eq!(total().as_deref(), Some("60700"));

    // Another writer seals one (100 B) as a gateway of an older release
    // would: the last base moved, so every record is summed again (the
    // rewritten one's 1000000 B with them), and the oldest go while the
    // rest holds 100000 B: those below 3000 (30000 B), not the large one.
    let () = redis::cmd("ZADD")
        .arg(&key)
        .arg(6010)
        .arg(record(6010, 100))
        .query(&mut conn)
        .expect("ZADD");
    redis.set_meta(&name, 0, &[("next_offset", "6020"), ("seg_base", "6020")]);
    let outcome = seal(policy);
    assert_eq!((outcome.deleted, outcome.log_start_offset), (300, 3000));
    assert_eq!(total().as_deref(), Some("1030700"));

    // And one deleted by such a gateway (the first): the first base moved.
    let () = redis::cmd("ZREMRANGEBYSCORE")
        .arg(&key)
        .arg(3000)
        .arg(3000)
        .query(&mut conn)
        .expect("ZREMRANGEBYSCORE");
    redis.set_meta(&name, 0, &[("log_start", "3010")]);
    assert_eq!(seal(policy).deleted, 0);
    assert_eq!(total().as_deref(), Some("30700"));

    // A compacted partition keeps no total: a compaction pass rewrites
    // sizes, even one that moves only tombstones and leaves the shape as it
    // was (an older release's, which would not say). Its records are read
    // on each call: the last but two grew behind the worker's back, and the
    // 100 B ones before it go while the rest holds 100000 B.
    redis.set_meta(&name, 0, &[("clean_end", "3010")]);
    rewrite(5990, 200_000);
    let compacted = SegmentPolicy {
        remote: false,
        ..policy
    };
    let outcome = seal(compacted);
    assert_eq!((outcome.deleted, outcome.log_start_offset), (298, 5990));
    assert_eq!(
        redis.meta_field(&name, 0, "sealed_shape"),
        None,
        "the shape kept from before is dropped"
    );
    // Its topic turned to remote storage (compaction stops): a total is
    // kept again, summed afresh: 200000 + 700 + 100 B.
    assert_eq!(seal(policy).deleted, 0);
    assert_eq!(total().as_deref(), Some("200800"));

    // A compaction pass of an older release (one under way when remote
    // storage was turned on, say) shrinks a segment and rewrites the
    // compacted stream's size, but leaves the shape: the total is summed
    // again (100000 + 700 + 100 B), and the shrunk segment, which the
    // rest no longer holds retention.bytes without, stays.
    rewrite(5990, 100_000);
    redis.set_meta(&name, 0, &[("clean_bytes", "4242")]);
    assert_eq!(
        seal(policy).deleted,
        0,
        "deleted on a total kept from before the pass"
    );
    assert_eq!(total().as_deref(), Some("100800"));
}

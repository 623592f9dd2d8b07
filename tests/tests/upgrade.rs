//! Upgrades and the Redis layout version (issue #10): a gateway refuses a
//! layout newer than it understands, and a running two-gateway system
//! upgrades one gateway at a time from the release before the layout was
//! versioned, with its data and committed offsets intact, while the
//! not-yet-upgraded gateway keeps serving beside the migrated layout. The
//! layout's last step (3: compact producer state) waits until no gateway
//! of the previous release is live.
//!
//! The previous release's binary comes from `$KETCH_UPGRADE_BASE_BIN`;
//! `scripts/test.sh` builds it from the commit named in
//! `scripts/upgrade-base`.

use std::path::PathBuf;
use std::time::Duration;

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, check_round_robin_records, ketch_bin, runtime, unique_topic};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
const GROUP: &str = "upgrade-group";
/// The upgraded gateways take the layout's last step half a second after
/// no gateway of the previous release is live (the default waits a
/// minute).
const FAST_LAYOUT_STEP: [&str; 2] = ["--set", "cluster.layout_step_delay=500ms"];

fn upgrade_base() -> PathBuf {
    let path = std::env::var_os("KETCH_UPGRADE_BASE_BIN")
        .map(PathBuf::from)
        .expect(
            "KETCH_UPGRADE_BASE_BIN is not set: scripts/test.sh builds the previous release's ketch \
         (the commit in scripts/upgrade-base) and sets it",
        );
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

fn layout(redis: &RedisServer) -> Option<String> {
    redis::cmd("HGET")
        .arg("ketch:layout")
        .arg("version")
        .query(&mut redis.connection())
        .expect("HGET ketch:layout")
}

fn node_args(id: &'static str) -> [&'static str; 6] {
    [
        "--node-id",
        id,
        "--set",
        "cluster.heartbeat_interval=100ms",
        "--set",
        "cluster.node_timeout=2s",
    ]
}

/// Produces records `range` (value `r<i>`, partition `i % PARTITIONS`)
/// through `producer`, each acknowledged.
fn produce(producer: &FutureProducer, topic: &str, range: std::ops::Range<usize>) {
    let rt = runtime();
    for i in range {
        let value = format!("r{i}");
        let delivery = producer
            .send_result(
                FutureRecord::<(), _>::to(topic)
                    .payload(&value)
                    .partition(i as i32 % PARTITIONS),
            )
            .map_err(|(e, _)| e)
            .expect("queued");
        rt.block_on(delivery)
            .expect("delivered")
            .map_err(|(e, _)| e)
            .expect("acknowledged");
    }
}

fn group_consumer(ketch: &Ketch) -> BaseConsumer {
    ketch.consumer_with(&[("group.id", GROUP), ("enable.auto.commit", "false")])
}

fn committed(ketch: &Ketch, topic: &str) -> Vec<i64> {
    let consumer = group_consumer(ketch);
    let mut asked = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        asked.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(asked, Duration::from_secs(20))
        .expect("committed offsets");
    (0..PARTITIONS)
        .map(
            |p| match got.find_partition(topic, p).expect("partition").offset() {
                Offset::Offset(offset) => offset,
                other => panic!("partition {p}: committed {other:?}"),
            },
        )
        .collect()
}

/// Appends records `range` as `produce` does, one batch each, through
/// `ketch` itself (which appends to any partition it is sent).
fn produce_through(ketch: &Ketch, topic: &str, range: std::ops::Range<usize>) {
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for i in range {
        let partition = (i % PARTITIONS as usize) as i32;
        let record = Record::value(batch::at(0), format!("r{i}").as_bytes());
        let offset = (i / PARTITIONS as usize) as i64;
        assert_eq!(
            raw::produce(&mut conn, topic, partition, batch::encode(&[record])),
            (code::NONE, offset),
            "record {i}"
        );
    }
}

/// Each partition's `next_offset`, `sized_from` and `sized_to` (the range
/// its size classes describe).
fn size_classes(redis: &RedisServer) -> Vec<(i64, Option<i64>, Option<i64>)> {
    let mut conn = redis.connection();
    let metas: Vec<String> = redis::cmd("KEYS")
        .arg("ketch:{*}:meta")
        .query(&mut conn)
        .expect("KEYS");
    assert_eq!(metas.len(), PARTITIONS as usize, "{metas:?}");
    metas
        .iter()
        .map(|meta| {
            let (next, from, to): (i64, Option<i64>, Option<i64>) = redis::cmd("HMGET")
                .arg(meta)
                .arg("next_offset")
                .arg("sized_from")
                .arg("sized_to")
                .query(&mut conn)
                .expect("HMGET meta");
            (next, from, to)
        })
        .collect()
}

#[test]
fn a_gateway_refuses_a_layout_newer_than_it_understands() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("HSET")
        .arg("ketch:layout")
        .arg("version")
        .arg(99)
        .query(&mut redis.connection())
        .expect("HSET");
    let output = Ketch::start_expecting_failure(&redis.url(), &[]);
    assert!(
        output.contains("the Redis layout is version 99, newer than the 3 this ketch understands"),
        "{output}"
    );
    assert_eq!(
        layout(&redis).as_deref(),
        Some("99"),
        "the newer layout is left alone"
    );
}

#[test]
fn a_new_namespace_records_the_current_layout() {
    let redis = RedisServer::start();
    let _ketch = Ketch::start(&redis.url(), &[]);
    assert_eq!(layout(&redis).as_deref(), Some("3"));
}

#[test]
fn two_gateways_upgrade_one_at_a_time_from_the_previous_release_with_data_and_offsets_intact() {
    let base = upgrade_base();
    let redis = RedisServer::start();
    let mut a = Ketch::start_binary(&base, &redis.url(), &node_args("1"));
    let mut b = Ketch::start_binary(&base, &redis.url(), &node_args("2"));
    let topic = unique_topic("upgrade");
    a.create_topic(&runtime(), &topic, PARTITIONS);
    produce(&a.producer(), &topic, 0..300);
    produce(&b.producer(), &topic, 300..450);
    let offsets: Vec<i64> = (0..PARTITIONS as i64).map(|p| 40 + p).collect();
    let mut commit = TopicPartitionList::new();
    for (p, offset) in offsets.iter().enumerate() {
        commit
            .add_partition_offset(&topic, p as i32, Offset::Offset(*offset))
            .expect("offset");
    }
    group_consumer(&b)
        .commit(&commit, CommitMode::Sync)
        .expect("commit through the previous release");
    assert_eq!(
        layout(&redis),
        None,
        "the previous release writes no layout version"
    );

    // The first gateway is upgraded and migrates the layout while the
    // second, still the previous release, serves beside it.
    a.replace_with_more(&ketch_bin(), &FAST_LAYOUT_STEP);
    assert_eq!(layout(&redis).as_deref(), Some("2"));
    assert!(a.output().contains("migrated the Redis layout"), "{}", a.output());
    // Appends alternate between the gateways (a client's producer would send
    // each partition's to its leader): the upgraded one keeps size
    // classes in each partition's meta, the previous release does not, so
    // each partition's classes restart after the previous release's batches.
    produce_through(&a, &topic, 450..525);
    produce_through(&b, &topic, 525..600);
    produce_through(&a, &topic, 600..750);
    for (next_offset, sized_from, sized_to) in size_classes(&redis) {
        assert_eq!(sized_to, Some(next_offset));
        assert!(sized_from > Some(175), "the classes restart after 525..600");
    }
    check_round_robin_records(&b, &topic, PARTITIONS, 750);
    assert_eq!(committed(&b, &topic), offsets);
    // One idempotent producer appends through both (each partition to its
    // leader): the previous release reads the state the upgraded gateway
    // writes, so it stays JSON, and so does the layout.
    let idempotent = a.producer_with(&[("enable.idempotence", "true")]);
    produce(&idempotent, &topic, 750..810);
    assert_eq!(layout(&redis).as_deref(), Some("2"));
    let states = producer_states(&redis, &topic);
    assert_eq!(
        states.len(),
        PARTITIONS as usize,
        "one producer in each partition"
    );
    assert!(
        states.iter().all(|s| s.first() == Some(&b'{')),
        "JSON beside the previous release"
    );
    idempotent_batches_alternate_between_releases(&a, &b);

    b.replace_with_more(&ketch_bin(), &FAST_LAYOUT_STEP);
    // With no gateway of the previous release left, the layout takes its
    // last step: producer state may be compact from then on.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while layout(&redis).as_deref() != Some("3") {
        assert!(
            std::time::Instant::now() < deadline,
            "the layout stayed 2:\n{}\n{}",
            a.output(),
            b.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each gateway says when it writes compact state: as it takes the
    // step, as it finds it taken, or as it starts on layout 3.
    let compact = |k: &Ketch| k.output().contains("writing compact producer state");
    while !(compact(&a) && compact(&b)) {
        assert!(
            std::time::Instant::now() < deadline,
            "a gateway never turned to compact state:\n{}\n{}",
            a.output(),
            b.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The layout set back under compact state (a failover that lost the
    // step's write): the gateways record 3 again, so no release that reads
    // only JSON starts.
    let _: i64 = redis::cmd("HSET")
        .arg("ketch:layout")
        .arg("version")
        .arg("2")
        .query(&mut redis.connection())
        .expect("HSET ketch:layout");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while layout(&redis).as_deref() != Some("3") {
        assert!(
            std::time::Instant::now() < deadline,
            "the layout stayed 2 under compact state:\n{}\n{}",
            a.output(),
            b.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The same producer goes on: its next batches are checked against the
    // JSON state and rewrite it compact.
    produce(&idempotent, &topic, 810..870);
    let states = producer_states(&redis, &topic);
    assert_eq!(states.len(), PARTITIONS as usize);
    assert!(
        states.iter().all(|s| s.first() == Some(&1)),
        "compact after the upgrade"
    );
    produce(&b.producer(), &topic, 870..900);
    check_round_robin_records(&a, &topic, PARTITIONS, 900);
    check_round_robin_records(&b, &topic, PARTITIONS, 900);
    assert_eq!(committed(&a, &topic), offsets);
    assert_eq!(committed(&b, &topic), offsets);
}

/// One producer's batches to one partition alternate between the upgraded
/// gateway and the previous release, so each reads the JSON state the
/// other wrote; retries are answered by the release that did not store
/// the batch. (A partition's leader moves between gateways as they
/// restart.)
fn idempotent_batches_alternate_between_releases(upgraded: &Ketch, previous: &Ketch) {
    let mut conns = [
        KafkaConn::connect(upgraded.kafka_addr()),
        KafkaConn::connect(previous.kafka_addr()),
    ];
    let topic = unique_topic("upgrade-idempotent");
    assert_eq!(raw::create_topic(&mut conns[0], &topic, 1), code::NONE);
    let producer_id = 424_242;
    let batch = |seq: i32| {
        let record = Record::value(batch::at(0), format!("s{seq}").as_bytes());
        batch::encode_idempotent(&[record], producer_id, 0, seq)
    };
    for seq in 0..6 {
        let conn = &mut conns[seq as usize % 2];
        assert_eq!(
            raw::produce(conn, &topic, 0, batch(seq)),
            (code::NONE, i64::from(seq)),
            "sequence {seq}"
        );
    }
    assert_eq!(
        raw::produce(&mut conns[1], &topic, 0, batch(4)),
        (code::NONE, 4),
        "a retry through the previous release"
    );
    assert_eq!(
        raw::produce(&mut conns[0], &topic, 0, batch(5)),
        (code::NONE, 5),
        "a retry through the upgraded gateway"
    );
    assert_eq!(raw::produce(&mut conns[1], &topic, 0, batch(6)), (code::NONE, 6));
}

/// Every idempotent producer state of every partition of `topic`, as
/// stored.
fn producer_states(redis: &RedisServer, topic: &str) -> Vec<Vec<u8>> {
    let mut conn = redis.connection();
    redis
        .topic_tags(topic)
        .iter()
        .flat_map(|tag| {
            redis::cmd("HVALS")
                .arg(format!("ketch:{{{tag}}}:producers"))
                .query::<Vec<Vec<u8>>>(&mut conn)
                .expect("HVALS")
        })
        .collect()
}

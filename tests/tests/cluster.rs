//! ketch on a Redis Cluster (issue #11): a real cluster of 3 masters and 3
//! replicas, two gateways in `redis.mode = cluster`. Partitions are spread
//! evenly over the masters; produce (idempotent, acks=all waiting for a
//! replica), fetch, long-poll wake-ups across gateways, consumer-group
//! offsets, DeleteRecords, ListOffsets, CreatePartitions and topic deletion
//! all work there, with no CROSSSLOT error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{
    Frozen, Ketch, RedisCluster, assert_fetch_wakes_across, check_round_robin_records, ketch_command,
    runtime, unique_topic,
};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 12;

fn gateway(cluster: &RedisCluster, id: &str) -> Ketch {
    gateway_with(cluster, id, &[])
}

/// A gateway on `cluster`; where the cluster has replicas, its acks=all
/// waits for one (without replicas every such wait would run to its
/// timeout: topic creation waits for them too).
fn gateway_with(cluster: &RedisCluster, id: &str, extra: &[&str]) -> Ketch {
    let mut args = Vec::from(extra);
    if cluster.replicas() > 0 {
        args.splice(0..0, ["--set", "storage.acks_all_replicas=1"]);
    }
    gateway_seeded(&cluster.url(), id, &args)
}

/// A gateway given only the seed nodes in `seeds` (`redis.url`).
fn gateway_seeded(seeds: &str, id: &str, extra: &[&str]) -> Ketch {
    let mut args = vec![
        "--node-id",
        id,
        "--set",
        "redis.mode=cluster",
        "--set",
        "cluster.heartbeat_interval=100ms",
        "--set",
        "cluster.node_timeout=2s",
    ];
    args.extend_from_slice(extra);
    Ketch::start(seeds, &args)
}

/// The masters (by port) holding each partition of `topic`, read from the
/// topic record's hash tags.
fn placement(cluster: &RedisCluster, topic: &str) -> Vec<u16> {
    tags(cluster, topic)
        .iter()
        .map(|tag| cluster.master_of(&format!("{{{tag}}}")))
        .collect()
}

/// The hash tags of the topic's partitions, in partition order.
fn tags(cluster: &RedisCluster, topic: &str) -> Vec<String> {
    let record: String = redis::cmd("HGET")
        .arg("ketch:topics")
        .arg(topic)
        .query(&mut cluster.connection())
        .expect("topic record");
    let record: serde_json::Value = serde_json::from_str(&record).expect("topic JSON");
    record["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|tag| tag.as_str().expect("tag").to_owned())
        .collect()
}

fn per_master(masters: &[u16]) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for m in masters {
        *counts.entry(*m).or_default() += 1;
    }
    counts
}

/// Produces records `range` (value `r<i>`, partition `i % PARTITIONS`),
/// all in flight at once, each acknowledged.
fn produce(producer: &FutureProducer, topic: &str, range: std::ops::Range<usize>) {
    let rt = runtime();
    let deliveries: Vec<_> = range
        .map(|i| {
            let value = format!("r{i}");
            producer
                .send_result(
                    FutureRecord::<(), _>::to(topic)
                        .payload(&value)
                        .partition(i as i32 % PARTITIONS),
                )
                .map_err(|(e, _)| e)
                .expect("queued")
        })
        .collect();
    for delivery in deliveries {
        rt.block_on(delivery)
            .expect("delivered")
            .map_err(|(e, _)| e)
            .expect("acknowledged");
    }
}

fn group_consumer(ketch: &Ketch, group: &str) -> BaseConsumer {
    ketch.consumer_with(&[("group.id", group), ("enable.auto.commit", "false")])
}

#[test]
fn two_gateways_serve_a_topic_spread_evenly_over_a_redis_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let a = gateway(&cluster, "1");
    let b = gateway(&cluster, "2");
    let topic = unique_topic("cluster");
    a.create_topic(&runtime(), &topic, PARTITIONS);

    // Balanced placement: 4 partitions on each of the 3 masters.
    let masters = placement(&cluster, &topic);
    let counts = per_master(&masters);
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|n| *n == 4), "{counts:?}");
    // The operator's view says the same.
    let output = ketch_command()
        .args([
            "placement",
            "--redis-url",
            &cluster.url(),
            "--set",
            "redis.mode=cluster",
        ])
        .output()
        .expect("run ketch placement");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(&topic)).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines.iter().all(|l| l.ends_with("\t4")), "{stdout}");

    // Idempotent acks=all producers through both gateways (each partition's
    // appends land on its leader: some on each gateway).
    let idempotent = [("enable.idempotence", "true"), ("acks", "all")];
    produce(&a.producer_with(&idempotent), &topic, 0..600);
    produce(&b.producer_with(&idempotent), &topic, 600..1200);
    check_round_robin_records(&a, &topic, PARTITIONS, 1200);
    check_round_robin_records(&b, &topic, PARTITIONS, 1200);

    // Committed offsets of a group, spread over slots, read back through
    // the other gateway.
    let group = unique_topic("cluster-group");
    let mut commit = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        commit
            .add_partition_offset(&topic, p, Offset::Offset(10 + i64::from(p)))
            .expect("offset");
    }
    group_consumer(&a, &group)
        .commit(&commit, CommitMode::Sync)
        .expect("commit");
    let mut asked = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        asked.add_partition(&topic, p);
    }
    let got = group_consumer(&b, &group)
        .committed_offsets(asked, Duration::from_secs(20))
        .expect("committed offsets");
    for p in 0..PARTITIONS {
        assert_eq!(
            got.find_partition(&topic, p).expect("partition").offset(),
            Offset::Offset(10 + i64::from(p))
        );
    }
}

#[test]
fn a_fetch_waiting_on_one_gateway_wakes_for_an_append_through_another() {
    let cluster = RedisCluster::start(3, 0);
    let a = gateway(&cluster, "1");
    let b = gateway(&cluster, "2");
    // Three partitions, one per master: each long-poll subscribes on the
    // master that owns its channel's slot.
    assert_fetch_wakes_across(&a, &b, 3);
}

#[test]
fn admin_operations_touch_partitions_on_every_master() {
    let cluster = RedisCluster::start(3, 0);
    let a = gateway(&cluster, "1");
    let topic = unique_topic("cluster-admin");
    let mut conn = KafkaConn::connect(a.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 3), code::NONE);
    for partition in 0..3 {
        for n in 0..20 {
            let record = batch::encode(&[Record::value(batch::at(1_000 + n), b"x")]);
            assert_eq!(
                raw::produce(&mut conn, &topic, partition, record),
                (code::NONE, n)
            );
        }
        assert_eq!(
            raw::delete_records(&mut conn, &topic, partition, 5),
            (code::NONE, 5)
        );
        assert_eq!(raw::list_offsets(&mut conn, &topic, partition, -2).1, 5);
        assert_eq!(raw::list_offsets(&mut conn, &topic, partition, -1).1, 20);
        let (error, offset, _) = raw::list_offsets(&mut conn, &topic, partition, batch::at(1_010));
        assert_eq!((error, offset), (code::NONE, 10));
    }

    // CreatePartitions: 3 → 9, the new ones evening out the masters.
    let rt = runtime();
    let admin = a.admin();
    let opts = rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = rt
        .block_on(admin.create_partitions([&rdkafka::admin::NewPartitions::new(&topic, 9)], &opts))
        .expect("CreatePartitions");
    for result in results {
        result.expect("partitions added");
    }
    let counts = per_master(&placement(&cluster, &topic));
    assert!(counts.values().all(|n| *n == 3), "{counts:?}");
    let record = batch::encode(&[Record::value(batch::at(1), b"new")]);
    assert_eq!(raw::produce(&mut conn, &topic, 8, record), (code::NONE, 0));

    // Deleting the topic removes every partition's keys, on every master.
    let results = rt
        .block_on(admin.delete_topics(&[&topic], &opts))
        .expect("DeleteTopics");
    for result in results {
        result.expect("deleted");
    }
    for node in &cluster.nodes {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("ketch:{*}:*")
            .query(&mut node.connection())
            .expect("KEYS");
        assert!(keys.is_empty(), "left behind on port {}: {keys:?}", node.port());
    }
}

#[test]
fn acks_all_waits_on_the_master_that_took_the_write() {
    let cluster = RedisCluster::start(3, 1);
    let ketch = Ketch::start(
        &cluster.url(),
        &[
            "--set",
            "redis.mode=cluster",
            "--set",
            "storage.acks_all_replicas=1",
            "--set",
            // Long enough for a healthy replica on a busy machine (a timeout
            // here is the failure the test provokes on purpose).
            "storage.acks_all_timeout=2s",
        ],
    );
    let topic = unique_topic("cluster-acks");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 3), code::NONE);
    let masters = placement(&cluster, &topic);
    assert_eq!(per_master(&masters).len(), 3, "one partition per master");
    let produce = |conn: &mut KafkaConn, partition: i32, value: &[u8]| {
        let request = raw::produce_request(
            &topic,
            partition,
            batch::encode(&[Record::value(batch::at(1), value)]),
        )
        .with_acks(-1);
        raw::produce_result(&conn.request(raw::PRODUCE_VERSION, &request))
    };
    for partition in 0..3 {
        assert_eq!(produce(&mut conn, partition, b"before"), (code::NONE, 0));
    }

    // A master that does not hold the topic records loses its replica
    // (frozen: connected, silent). Its acks=all appends time out waiting;
    // the other masters' do not, so each WAIT ran on its own master's
    // connection.
    let records_master = cluster.master_of("ketch:topics");
    let victim = (0..3)
        .find(|&p| masters[p] != records_master)
        .expect("a partition away from the topic records");
    let frozen = Frozen::freeze(cluster.replica_of(masters[victim]).pid());
    for partition in 0..3 {
        let outcome = produce(&mut conn, partition as i32, b"after");
        if partition == victim {
            assert_eq!(outcome.0, 20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND");
        } else {
            assert_eq!(outcome, (code::NONE, 1));
        }
    }

    // An offset kept longer than the broker's retention (OffsetCommit v4's
    // `retention_time_ms`) first notes how long in the group's keep-until
    // key. For ids whose hash tag is empty that key lies on its own slot:
    // one on the frozen master, the offsets elsewhere, is waited for there
    // before the offsets are written (no WAIT of theirs covers it), and
    // the commit fails retriably, its offsets unwritten.
    let group = (0..1000)
        .map(|n| format!("}}{n}"))
        .find(|group| {
            cluster.master_of(&format!("ketch:group:{{{group}}}:keep-until")) == masters[victim]
                && cluster.master_of(&format!("ketch:group:{{{group}}}:offsets")) != masters[victim]
        })
        .expect("a group id with its keep-until key on the frozen master");
    let commit = raw::offset_commit_request(&group, "", -1, &topic, 0, 1).with_retention_time_ms(3_600_000);
    assert_eq!(
        conn.request(4, &commit).topics[0].partitions[0].error_code,
        15,
        "COORDINATOR_NOT_AVAILABLE: the keep-until write is not confirmed"
    );
    let offsets: i64 = redis::cmd("EXISTS")
        .arg(format!("ketch:group:{{{group}}}:offsets"))
        .query(&mut cluster.connection())
        .unwrap();
    assert_eq!(offsets, 0, "the offsets are written only after");

    // A new topic's partitions there are waited for too (a failover that
    // lost their metadata would leave them refusing appends), once per
    // master: 12 partitions put 4 on it, and one wait each would take 8 s.
    // The creation stands, unconfirmed, as Kafka's controller does not wait
    // for data replicas.
    let wide = unique_topic("cluster-acks-wide");
    let started = Instant::now();
    assert_eq!(raw::create_topic(&mut conn, &wide, 12), code::NONE);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1_800) && elapsed < Duration::from_secs(6),
        "the creation answered after {elapsed:?}: not one 2 s wait for the frozen master"
    );
    assert_eq!(per_master(&placement(&cluster, &wide))[&masters[victim]], 4);
    let started = Instant::now();
    assert_eq!(raw::create_partitions(&mut conn, &wide, 15), code::NONE);
    assert!(
        started.elapsed() >= Duration::from_millis(1_800),
        "the growth answered after {:?}, before the acks_all timeout",
        started.elapsed()
    );
    drop(frozen);
}

/// What one producer thread sent and had acknowledged: (partition, offset,
/// value) in send order.
type Acked = Vec<(i32, i64, String)>;

/// Sends `p<id>-<n>` records to partitions `n % partitions` in windows of
/// 20 in flight until `stop`, recording every acknowledgement; panics on a
/// delivery that fails (the client gave up: a non-retriable error, or
/// retriable ones for longer than its timeout).
fn produce_until(
    producer: FutureProducer,
    topic: String,
    id: usize,
    partitions: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acked: std::sync::Arc<std::sync::Mutex<Acked>>,
) {
    let rt = runtime();
    let mut n = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let window: Vec<_> = (n..n + 20)
            .map(|n| {
                let value = format!("p{id}-{n}");
                let partition = (n % partitions as usize) as i32;
                let delivery = producer
                    .send_result(
                        FutureRecord::<(), _>::to(&topic)
                            .payload(&value)
                            .partition(partition),
                    )
                    .map_err(|(e, _)| e)
                    .expect("queued");
                (partition, value, delivery)
            })
            .collect();
        for (partition, value, delivery) in window {
            let offset = rt
                .block_on(delivery)
                .expect("delivered")
                .map_err(|(e, _)| e)
                .unwrap_or_else(|e| panic!("{value}: {e}"))
                .offset;
            acked.lock().unwrap().push((partition, offset, value));
        }
        n += 20;
    }
}

#[test]
fn a_master_killed_under_idempotent_acks_all_producers_loses_and_repeats_nothing() {
    const PARTS: i32 = 6;
    let mut cluster = RedisCluster::start(3, 1);
    let fast = ["--set", "storage.acks_all_timeout=1s"];
    let a = gateway_with(&cluster, "1", &fast);
    let b = gateway_with(&cluster, "2", &fast);
    let topic = unique_topic("cluster-failover");
    a.create_topic(&runtime(), &topic, PARTS);
    let victim = placement(&cluster, &topic)[0];
    let tag_key = {
        let record: String = redis::cmd("HGET")
            .arg("ketch:topics")
            .arg(&topic)
            .query(&mut cluster.connection())
            .expect("topic record");
        let record: serde_json::Value = serde_json::from_str(&record).expect("JSON");
        format!("{{{}}}", record["tags"][0].as_str().expect("tag"))
    };

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked: Vec<std::sync::Arc<std::sync::Mutex<Acked>>> = (0..2).map(|_| Default::default()).collect();
    let settings = [
        ("enable.idempotence", "true"),
        ("acks", "all"),
        ("message.timeout.ms", "120000"),
        ("linger.ms", "1"),
    ];
    let threads: Vec<_> = [&a, &b]
        .iter()
        .enumerate()
        .map(|(id, ketch)| {
            let producer = ketch.producer_with(&settings);
            let (topic, stop, acked) = (topic.clone(), stop.clone(), acked[id].clone());
            std::thread::spawn(move || produce_until(producer, topic, id, PARTS, stop, acked))
        })
        .collect();
    let acked_count = |acked: &[std::sync::Arc<std::sync::Mutex<Acked>>]| -> Vec<usize> {
        acked.iter().map(|a| a.lock().unwrap().len()).collect()
    };
    let await_acked = |at_least: Vec<usize>| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while acked_count(&acked).iter().zip(&at_least).any(|(n, min)| n < min) {
            assert!(
                Instant::now() < deadline,
                "producers stalled at {:?} (wanted {at_least:?})\n{}\n{}",
                acked_count(&acked),
                a.output(),
                b.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    await_acked(vec![300, 300]);

    // SIGKILL the master of partition 0 while both producers write. Its
    // replica takes over but has no replica of its own, so acks=all appends
    // to its partitions fail retriably (NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    // after being written) until the killed node is back, as its replica.
    cluster.node_mut(victim).stop();
    cluster.await_failover(&tag_key, victim, Duration::from_secs(60));
    cluster.node_mut(victim).start_again();
    cluster.await_ok(Duration::from_secs(60));
    let before = acked_count(&acked);
    await_acked(before.iter().map(|n| n + 300).collect());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("producer thread");
    }

    // Every acknowledged record is in the log once, at the offset it was
    // acknowledged at, and each producer's records keep their order.
    let acked: Vec<Acked> = acked.iter().map(|a| a.lock().unwrap().clone()).collect();
    check_exactly_once(&a, &topic, PARTS, &acked);
}

/// Reads `topic` from the start until `stop`, checking offsets stay dense
/// per partition; returns how many records it read.
fn consume_until(
    consumer: BaseConsumer,
    partitions: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> usize {
    let mut next = vec![0i64; partitions as usize];
    let mut read = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.expect("consume");
        let p = message.partition() as usize;
        assert_eq!(
            message.offset(),
            next[p],
            "partition {p}: dense offsets while resharding"
        );
        next[p] += 1;
        read += 1;
    }
    read
}

/// Checks that every acknowledged record is in the log once, at its
/// acknowledged offset, each producer's records in order.
fn check_exactly_once(ketch: &Ketch, topic: &str, partitions: i32, acked: &[Acked]) {
    let total: usize = acked.iter().map(Vec::len).sum();
    let consumer = ketch.consumer_at(topic, &(0..partitions).collect::<Vec<_>>(), 0);
    let mut log: BTreeMap<(i32, i64), String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while log.len() < total {
        assert!(Instant::now() < deadline, "read {} of {total} records", log.len());
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("consume");
        let value = String::from_utf8(message.payload().expect("value").to_vec()).expect("UTF-8");
        log.insert((message.partition(), message.offset()), value);
    }
    for (id, records) in acked.iter().enumerate() {
        let mut last: BTreeMap<i32, i64> = BTreeMap::new();
        for (partition, offset, value) in records {
            assert_eq!(
                log.get(&(*partition, *offset)),
                Some(value),
                "producer {id}: {value} acknowledged at {partition}/{offset}"
            );
            let previous = last.insert(*partition, *offset);
            assert!(previous < Some(*offset), "producer {id}: {value} out of order");
        }
    }
    let mut values: Vec<&String> = log.values().collect();
    values.sort();
    let before_dedup = values.len();
    values.dedup();
    assert_eq!(values.len(), before_dedup, "a record is in the log twice");
}

#[test]
fn slots_resharded_under_running_producers_and_consumers_lose_and_repeat_nothing() {
    // Appends that WAIT for a replica, on connections of their own.
    reshard_under_load(1);
}

#[test]
fn slots_resharded_under_appends_that_do_not_wait_lose_and_repeat_nothing() {
    // Appends on each master's shared connection, following ASK through
    // the cluster connection.
    reshard_under_load(0);
}

/// Moves every slot of one master while two idempotent producers and a
/// consumer run; `replicas` per master, and acks=all waits for that many.
fn reshard_under_load(replicas: usize) {
    const PARTS: i32 = 6;
    // Appends go to their master directly and follow the moves themselves
    // (MOVED, ASK), beside the reads and wake-ups of the cluster connection.
    let cluster = RedisCluster::start(3, replicas);
    let waits = format!("storage.acks_all_replicas={replicas}");
    let a = gateway_with(&cluster, "1", &["--set", &waits]);
    let topic = unique_topic("cluster-reshard");
    a.create_topic(&runtime(), &topic, PARTS);
    let masters = placement(&cluster, &topic);
    let (from, to) = (
        masters[0],
        *masters
            .iter()
            .find(|m| **m != masters[0])
            .expect("another master"),
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked: Vec<std::sync::Arc<std::sync::Mutex<Acked>>> = (0..2).map(|_| Default::default()).collect();
    let settings = [
        ("enable.idempotence", "true"),
        ("acks", "all"),
        ("message.timeout.ms", "120000"),
        ("linger.ms", "1"),
    ];
    let producers: Vec<_> = (0..2)
        .map(|id| {
            let producer = a.producer_with(&settings);
            let (topic, stop, acked) = (topic.clone(), stop.clone(), acked[id].clone());
            std::thread::spawn(move || produce_until(producer, topic, id, PARTS, stop, acked))
        })
        .collect();
    let consumer = {
        let consumer = a.consumer_at(&topic, &(0..PARTS).collect::<Vec<_>>(), 0);
        let stop = stop.clone();
        std::thread::spawn(move || consume_until(consumer, PARTS, stop))
    };
    let acked_count = || -> usize { acked.iter().map(|a| a.lock().unwrap().len()).sum() };
    let await_acked = |at_least: usize| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while acked_count() < at_least {
            assert!(
                Instant::now() < deadline,
                "producers stalled at {}\n{}",
                acked_count(),
                a.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    await_acked(600);

    // Every slot of partition 0's master moves, its partitions' keys with
    // them, while the producers and the consumer run.
    cluster.reshard_all(from, to);
    let moved = placement(&cluster, &topic);
    assert!(!moved.contains(&from), "{moved:?}");
    let after = acked_count();
    await_acked(after + 600);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for producer in producers {
        producer.join().expect("producer thread");
    }
    let read_while_running = consumer.join().expect("consumer thread");
    assert!(read_while_running > 0);
    // A MOVED is followed inside the gateway (the slot map read again), not
    // answered to the client as an error.
    assert!(
        !a.output().to_ascii_uppercase().contains("MOVED"),
        "a MOVED reached a client:\n{}",
        a.output()
    );
    let acked: Vec<Acked> = acked.iter().map(|a| a.lock().unwrap().clone()).collect();
    check_exactly_once(&a, &topic, PARTS, &acked);
}

#[test]
fn a_password_protected_cluster_is_reached_with_the_urls_credentials() {
    let cluster = RedisCluster::start_with_password(3, 1, "cl0ster");
    // user:password (Redis's default user), as an ACL user would be given.
    let url = cluster
        .url()
        .replace("redis://:cl0ster@", "redis://default:cl0ster@");
    let a = Ketch::start(&url, &["--node-id", "1", "--set", "storage.acks_all_replicas=1"]);
    let b = Ketch::start(&url, &["--node-id", "2", "--set", "storage.acks_all_replicas=1"]);
    let topic = unique_topic("cluster-auth");
    let mut conn_a = KafkaConn::connect(a.kafka_addr());
    let mut conn_b = KafkaConn::connect(b.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn_a, &topic, 3), code::NONE);
    for partition in 0..3 {
        let request = raw::produce_request(
            &topic,
            partition,
            batch::encode(&[Record::value(batch::at(1), b"x")]),
        )
        .with_acks(-1);
        assert_eq!(
            raw::produce_result(&conn_a.request(raw::PRODUCE_VERSION, &request)),
            (code::NONE, 0),
            "acks=all through the password-protected masters and their replicas"
        );
        let response = conn_b.request(12, &raw::fetch_request(&topic, partition, 0, 0));
        let (error, high_watermark, records) = raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (code::NONE, 1));
        assert_eq!(raw::count_records(&records.expect("records")), 1);
    }
    for gateway in [&a, &b] {
        let log = gateway.output();
        assert!(log.contains("ketch serving"), "{log}");
        assert!(
            !log.contains("cl0ster"),
            "the Redis password is in the log:\n{log}"
        );
    }
}

#[test]
fn a_wake_up_subscription_follows_its_slot_to_another_master() {
    let cluster = RedisCluster::start(3, 0);
    let a = gateway(&cluster, "1");
    let b = gateway(&cluster, "2");
    let topic = unique_topic("cluster-wake-move");
    let mut conn_a = KafkaConn::connect(a.kafka_addr());
    let mut conn_b = KafkaConn::connect(b.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn_a, &topic, 1), code::NONE);
    let first = batch::encode(&[Record::value(batch::at(1), b"first")]);
    assert_eq!(raw::produce(&mut conn_a, &topic, 0, first), (code::NONE, 0));
    // Gateway b long-polls the partition at its end: its channel is
    // subscribed on the partition's master; a short wait keeps it so.
    let response = conn_b.request(12, &raw::fetch_request(&topic, 0, 1, 100));
    assert_eq!(raw::fetch_result(&response).0, code::NONE);

    // The partition's slot moves to another master, its keys with it.
    let from = placement(&cluster, &topic)[0];
    let to = another_master(&cluster, from);
    cluster.reshard_all(from, to);
    assert_eq!(placement(&cluster, &topic), vec![to]);

    // A fetch parked on b now wakes for an append through a: b's
    // subscription followed the slot to its new master.
    parked_fetch_answers(
        &b,
        &mut conn_b,
        &mut conn_a,
        &topic,
        1,
        || {},
        "the subscription stayed on the old master",
    );

    // A fetch parked while the slot moves: Redis drops b's subscription
    // under it, and an append through a right after the move (before b
    // subscribes again where the slot went) is announced to no one on b.
    // b's fetch still answers: it reads again once the subscription is back.
    // (The master the slots left holds none now; Redis made it a replica.)
    let tag = format!("{{{}}}", tags(&cluster, &topic)[0]);
    let third = another_master(&cluster, to);
    parked_fetch_answers(
        &b,
        &mut conn_b,
        &mut conn_a,
        &topic,
        2,
        || cluster.move_slot_of(&tag, third),
        "an append while its subscription lapsed was missed",
    );
    assert_eq!(placement(&cluster, &topic), vec![third]);
}

/// The sum of the `/metrics` samples of `ketch` whose line starts with
/// `series` (a name, or a name and its first labels).
fn counter(ketch: &Ketch, series: &str) -> f64 {
    let (status, metrics) = ketch.http_get("/metrics");
    assert_eq!(status, 200);
    metrics
        .lines()
        .filter(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{', ',']))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// An audit of the wake-up subscriptions asks each master once for all of
/// its channels (one `PUBSUB SHARDNUMSUB` naming them), not once per
/// channel: with 24 partitions long-polled through one gateway, it costs a
/// master one such command, and takes no live subscription for lost.
#[test]
fn an_audit_asks_each_master_once_for_all_its_channels() {
    const PARTITIONS: i32 = 24;
    let cluster = RedisCluster::start(3, 0);
    let b = gateway_with(&cluster, "2", &["--set", "fetch.subscription_linger=300s"]);
    let topic = unique_topic("cluster-audit");
    let mut conn = KafkaConn::connect(b.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, PARTITIONS), code::NONE);
    for partition in 0..PARTITIONS {
        let response = conn.request(12, &raw::fetch_request(&topic, partition, 0, 100));
        assert_eq!(raw::fetch_result(&response).0, code::NONE);
    }
    let masters: Vec<u16> = cluster
        .slot_ranges()
        .into_iter()
        .map(|(_, _, port)| port)
        .collect();
    assert_eq!(masters.len(), 3);
    let asks = || -> u64 {
        masters
            .iter()
            .map(|port| {
                let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .and_then(|c| c.get_connection())
                    .expect("connect to a master");
                let stats: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut conn)
                    .expect("INFO");
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix("cmdstat_pubsub|shardnumsub:calls="))
                    .and_then(|l| l.split(',').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    };
    let audits = || counter(&b, "ketch_wake_subscription_audits_total") as u64;
    let audits_past = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while audits() < n {
            assert!(Instant::now() < deadline, "no audit");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Two audits after the subscriptions, so every channel is among those
    // audited from then on.
    audits_past(audits() + 2);
    let (audits_before, asks_before) = (audits(), asks());
    audits_past(audits_before + 4);
    let (audits_after, asks_after) = (audits(), asks());
    eprintln!(
        "{} PUBSUB SHARDNUMSUB over {} audits",
        asks_after - asks_before,
        audits_after - audits_before
    );
    // One audit may be under way at either sample.
    let most = (audits_after - audits_before + 1) * masters.len() as u64;
    assert!(
        asks_after - asks_before <= most,
        "{} PUBSUB SHARDNUMSUB over {} audits of {PARTITIONS} channels on {} masters",
        asks_after - asks_before,
        audits_after - audits_before,
        masters.len()
    );
    assert_eq!(
        counter(&b, "ketch_wake_subscription_losses_total{how=\"audit\"}"),
        0.0,
        "an audit took a live subscription for lost"
    );
}

/// A master serving slots, other than the one on `port`.
fn another_master(cluster: &RedisCluster, port: u16) -> u16 {
    cluster
        .slot_ranges()
        .into_iter()
        .map(|(_, _, p)| p)
        .find(|p| *p != port)
        .expect("another master")
}

/// Parks a fetch of up to 20 s at `offset` (partition 0 of `topic`) on
/// `fetcher`, a connection to `gateway`, runs `meanwhile`, appends one record there through
/// `producer`, and asserts the fetch answers with it well before its
/// limit; `late` says what a late answer means.
fn parked_fetch_answers(
    gateway: &Ketch,
    fetcher: &mut KafkaConn,
    producer: &mut KafkaConn,
    topic: &str,
    offset: i64,
    meanwhile: impl FnOnce(),
    late: &str,
) {
    let (elapsed, response) = std::thread::scope(|s| {
        let fetch = s.spawn(|| {
            let started = Instant::now();
            let response = fetcher.request(12, &raw::fetch_request(topic, 0, offset, 20_000));
            (started.elapsed(), response)
        });
        // The fetch has reached its gateway (it parks at once, at the end
        // it knows).
        gateway.await_inflight_requests(1);
        meanwhile();
        let record = batch::encode(&[Record::value(batch::at(offset), b"parked")]);
        assert_eq!(raw::produce(producer, topic, 0, record), (code::NONE, offset));
        fetch.join().expect("fetch thread")
    });
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, offset + 1));
    assert_eq!(raw::count_records(&records.expect("records")), 1);
    assert!(
        elapsed < Duration::from_secs(10),
        "the fetch waited {elapsed:?} for a 20 s limit: {late}"
    );
}

/// A gateway whose subscriber connection outlived a failover (the old
/// master back as the new master's replica, still the master in that
/// connection's slot map) subscribes where the slot is served: a fetch it
/// parks wakes for an append through another gateway. Subscribed on the
/// replica, the fetch would never be told (the append script announces
/// appends only to listeners on the master), and an audit that asked the
/// replica would find the subscription held.
#[test]
fn a_subscription_made_after_a_failover_is_on_the_new_master() {
    let mut cluster = RedisCluster::start(3, 1);
    let a = gateway_with(&cluster, "1", &[]);
    let b = gateway_with(&cluster, "2", &[]);
    let (mut conn_a, mut conn_b) = (
        KafkaConn::connect(a.kafka_addr()),
        KafkaConn::connect(b.kafka_addr()),
    );
    // b subscribes on every master: its subscriber connection knows them.
    let warm = unique_topic("cluster-failover-warm");
    assert_eq!(raw::create_topic(&mut conn_a, &warm, 6), code::NONE);
    for partition in 0..6 {
        let response = conn_b.request(12, &raw::fetch_request(&warm, partition, 0, 100));
        assert_eq!(raw::fetch_result(&response).0, code::NONE);
    }
    let victim = placement(&cluster, &warm)[0];
    let tag = format!("{{{}}}", tags(&cluster, &warm)[0]);
    cluster.node_mut(victim).stop();
    cluster.await_failover(&tag, victim, Duration::from_secs(60));
    cluster.node_mut(victim).start_again();
    cluster.await_ok(Duration::from_secs(60));
    let promoted = cluster.master_of(&tag);
    // A topic created now, on the promoted master (creating one fails
    // retriably until a's connections have found the new master, and a
    // client tries again).
    let deadline = Instant::now() + Duration::from_secs(60);
    let topic = (0..200)
        .filter_map(|n| {
            let topic = unique_topic(&format!("cluster-after-failover-{n}"));
            let created = raw::create_topic(&mut conn_a, &topic, 1);
            assert!(
                Instant::now() < deadline,
                "cannot create a topic after the failover: {created}"
            );
            (created == code::NONE).then_some(topic)
        })
        .find(|topic| placement(&cluster, topic)[0] == promoted)
        .expect("a topic on the promoted master");
    // b reads it (and so knows its end), then parks a fetch there.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = conn_b.request(12, &raw::fetch_request(&topic, 0, 0, 0));
        if raw::fetch_result(&response).0 == code::NONE {
            break;
        }
        assert!(Instant::now() < deadline, "b cannot read the new topic");
    }
    parked_fetch_answers(
        &b,
        &mut conn_b,
        &mut conn_a,
        &topic,
        0,
        || {},
        "b subscribed where the slot is not served",
    );
}

/// A master that stops answering without closing its connections
/// (frozen, as a partitioned or hung host), then failed over. Gateway a,
/// whose one seed node it is, must route around it (its commands time out,
/// its slot map is read from the other masters, and its cluster connection
/// is made again if it still follows that node). Redis holds gateway b's wake-up subscription on a node that
/// says nothing, and no push tells b: b must find it out (its audit of the
/// presence channels) instead of answering "nothing new" from what it knew
/// before.
#[test]
fn a_wake_up_subscription_on_a_frozen_master_is_found_dead() {
    let mut cluster = RedisCluster::start(3, 1);
    // Its subscription stays while nothing waits, for the whole test.
    let b = gateway_with(&cluster, "2", &["--set", "fetch.subscription_linger=300s"]);
    let topic = unique_topic("cluster-wake-frozen");
    let mut conn_b = KafkaConn::connect(b.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn_b, &topic, 1), code::NONE);
    let victim = placement(&cluster, &topic)[0];
    // Gateway a knows only the master that will stop answering as its seed:
    // it must find the others from the slot map.
    let a = gateway_seeded(
        &cluster.node_mut(victim).url(),
        "1",
        &["--set", "storage.acks_all_replicas=1"],
    );
    let mut conn_a = KafkaConn::connect(a.kafka_addr());
    let first = batch::encode(&[Record::value(batch::at(0), b"first")]);
    assert_eq!(raw::produce(&mut conn_a, &topic, 0, first), (code::NONE, 0));
    // b long-polls the partition's end: subscribed on its master, b knows
    // its next offset is 1.
    let response = conn_b.request(12, &raw::fetch_request(&topic, 0, 1, 100));
    let (error, high_watermark, _) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 1));
    // b's audits find its subscription held while its master answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while counter(&b, "ketch_wake_subscription_audits_total") < 2.0 {
        assert!(Instant::now() < deadline, "b audited no subscription");
        std::thread::sleep(Duration::from_millis(100));
    }
    let audit_losses = "ketch_wake_subscription_losses_total{how=\"audit\"}";
    assert_eq!(
        counter(&b, audit_losses),
        0.0,
        "an audit took a live subscription for lost"
    );
    let tag = format!("{{{}}}", tags(&cluster, &topic)[0]);

    let frozen = Frozen::freeze(cluster.node_mut(victim).pid());
    cluster.await_failover(&tag, victim, Duration::from_secs(60));
    // Through a, retrying as a client would until its data path finds the
    // new master: its commands to the frozen one time out, and a timeout
    // makes it read the slot map again (`SlotMapWatch`).
    let second = batch::encode(&[Record::value(batch::at(1), b"second")]);
    let failed_over = Instant::now();
    let deadline = failed_over + Duration::from_secs(90);
    loop {
        if raw::produce(&mut conn_a, &topic, 0, second.clone()).0 == code::NONE {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gateway a could not append after the failover\n{}",
            a.output()
        );
    }
    eprintln!(
        "gateway a appended {:?} after the failover",
        failed_over.elapsed()
    );
    // b reads it while the old master is still frozen.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = conn_b.request(12, &raw::fetch_request(&topic, 0, 1, 2_000));
        let (error, high_watermark, records) = raw::fetch_result(&response);
        if error == code::NONE && high_watermark == 2 {
            assert_eq!(raw::count_records(&records.expect("records")), 1);
            eprintln!("gateway b read it {:?} after the failover", failed_over.elapsed());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b still answers {error}, high watermark {high_watermark}: it trusts a dead subscription\n{}",
            b.output()
        );
    }
    assert!(
        counter(&b, audit_losses) >= 1.0,
        "no audit found the subscription lost"
    );
    // And b's subscription is live again, on the new master.
    parked_fetch_answers(
        &b,
        &mut conn_b,
        &mut conn_a,
        &topic,
        2,
        || {},
        "b did not subscribe again where the slot went",
    );
    drop(frozen);
}

/// The master holding the topic registry stops answering (frozen): the
/// partitions on the other masters are still produced to and fetched from,
/// each gateway serving from its last record of the topic, where every
/// request once its half-second copy aged failed until a failover.
#[test]
fn partitions_elsewhere_are_served_while_the_topic_registrys_master_is_frozen() {
    let mut cluster = RedisCluster::start(3, 0);
    let a = gateway_with(&cluster, "1", &["--set", "redis.command_timeout=1s"]);
    let topic = unique_topic("cluster-registry-frozen");
    let mut conn = KafkaConn::connect(a.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 6), code::NONE);
    let records_master = cluster.master_of("ketch:topics");
    let partition = placement(&cluster, &topic)
        .iter()
        .position(|master| *master != records_master)
        .expect("a partition away from the topic registry") as i32;
    let produce = |conn: &mut KafkaConn, value: &[u8]| {
        raw::produce(
            conn,
            &topic,
            partition,
            batch::encode(&[Record::value(batch::at(0), value)]),
        )
    };
    assert_eq!(produce(&mut conn, b"before"), (code::NONE, 0));
    // The other masters go on serving their slots once they take the frozen
    // one for failed (it has no replica to fail over to), rather than
    // answer CLUSTERDOWN for every key.
    for master in placement(&cluster, &topic) {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query(&mut cluster.node_mut(master).connection())
            .expect("CONFIG SET");
    }
    let frozen = Frozen::freeze(cluster.node_mut(records_master).pid());
    // Past the gateway's half-second copy of the topic.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(produce(&mut conn, b"during"), (code::NONE, 1));
    assert_eq!(produce(&mut conn, b"during, again"), (code::NONE, 2));
    let response = conn.request(12, &raw::fetch_request(&topic, partition, 0, 0));
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 3));
    assert_eq!(raw::count_records(&records.expect("records")), 3);
    drop(frozen);
}

/// A master holding neither registry that stops answering (frozen, no
/// replica to fail over to) takes its own partitions away, not the
/// gateways: `/ready` stays 200, with a warning, and answers within a load
/// balancer's check timeout. It was 503 on every gateway at once (a `PING`
/// goes to every master), after up to two command timeouts, so a load
/// balancer took every gateway out, and with them the partitions on the
/// other masters. A full master is a warning too.
#[test]
fn a_master_away_from_the_registries_frozen_or_full_leaves_the_gateways_ready() {
    let mut cluster = RedisCluster::start(3, 0);
    let a = gateway(&cluster, "1");
    let registries = [
        cluster.master_of("ketch:topics"),
        cluster.master_of("ketch:brokers"),
    ];
    let masters: Vec<u16> = cluster.slot_ranges().iter().map(|(_, _, port)| *port).collect();
    let victim = *masters
        .iter()
        .find(|port| !registries.contains(port))
        .expect("a master holding neither registry");
    let (status, body) = a.http_get("/ready");
    assert_eq!(status, 200, "{body}");
    // One partition on each master, the victim's among them.
    let topic = unique_topic("cluster-admin-frozen");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(a.kafka_addr()), &topic, 3),
        code::NONE
    );
    assert!(placement(&cluster, &topic).contains(&victim));
    let listed = |a: &Ketch| {
        let (status, body) = a.http_get("/api/v1/topics");
        assert_eq!(status, 200, "{body}");
        let listed: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        listed["topics"]
            .as_array()
            .expect("topics")
            .iter()
            .find(|t| t["name"] == topic.as_str())
            .cloned()
            .expect("the topic listed")
    };
    let entry = listed(&a);
    assert_eq!(
        (entry["records"].as_i64(), &entry["error"]),
        (Some(0), &serde_json::Value::Null)
    );

    // Full.
    let set = |cluster: &mut RedisCluster, port: u16, name: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut cluster.node_mut(port).connection())
            .expect("CONFIG SET");
    };
    set(&mut cluster, victim, "maxmemory", "1");
    let (status, body) = a.http_get("/ready");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("warning:") && body.contains("full"), "{body}");
    set(&mut cluster, victim, "maxmemory", "0");

    // Frozen: the others serve their slots once they take it for failed.
    for master in &masters {
        set(&mut cluster, *master, "cluster-require-full-coverage", "no");
    }
    let frozen = Frozen::freeze(cluster.node_mut(victim).pid());
    for _ in 0..3 {
        let asked = Instant::now();
        let (status, body) = a.http_get("/ready");
        let took = asked.elapsed();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("warning:"), "{body}");
        assert!(took < Duration::from_secs(3), "/ready took {took:?}");
    }
    // The admin API: the frozen master's memory is the one not read now
    // (the others are, each asked on its own), and the topic with a
    // partition there has no record count rather than a partial one.
    let (status, body) = a.http_get("/api/v1/redis");
    assert_eq!(status, 200, "{body}");
    let redis: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let servers = redis["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 3, "{body}");
    for server in servers {
        let address = server["server"].as_str().expect("address");
        let is_victim = address.ends_with(&format!(":{victim}"));
        assert_eq!(server["error"].is_string(), is_victim, "{body}");
    }
    let entry = listed(&a);
    assert!(
        entry["records"].is_null() && entry["error"].is_string(),
        "{entry}"
    );
    drop(frozen);
}

/// A fetch of a partition whose slot is being migrated, its log moved to
/// the new master and its metadata not yet, reads the records: each of the
/// read's commands goes where its key is (ASK), rather than the fetch
/// failing until the migration of the slot ends (`redis-cli --cluster
/// reshard` moves a slot's keys a batch at a time, a large log taking a
/// while).
#[test]
fn a_partition_whose_slot_is_half_migrated_is_read() {
    let cluster = RedisCluster::start(3, 0);
    let a = gateway(&cluster, "1");
    let topic = unique_topic("cluster-half-moved");
    let mut conn = KafkaConn::connect(a.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for n in 0..3 {
        let record = batch::encode(&[Record::value(batch::at(n), b"moving")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, record), (code::NONE, n));
    }
    let tag = format!("{{{}}}", tags(&cluster, &topic)[0]);
    let from = cluster.master_of(&tag);
    let mut migration = cluster.begin_slot_move(&tag, another_master(&cluster, from));
    migration.migrate(&[format!("ketch:{tag}:log")]);
    // A fresh gateway: no tail of the partition kept from the appends.
    let b = gateway(&cluster, "2");
    let mut reader = KafkaConn::connect(b.kafka_addr());
    let read = |reader: &mut KafkaConn| {
        let response = reader.request(12, &raw::fetch_request(&topic, 0, 0, 100));
        let (error, high_watermark, records) = raw::fetch_result(&response);
        (
            error,
            high_watermark,
            records.map_or(0, |r| raw::count_records(&r)),
        )
    };
    assert_eq!(read(&mut reader), (code::NONE, 3, 3), "read mid-migration");
    // Offsets by time read the log and the partition's metadata in one
    // pipeline: followed there too (KAFKA_STORAGE_ERROR for the whole
    // migration before).
    assert_eq!(
        raw::list_offsets(&mut reader, &topic, 0, batch::at(1)),
        (code::NONE, 1, batch::at(1)),
        "offsets by time mid-migration"
    );
    assert_eq!(raw::list_offsets(&mut reader, &topic, 0, -3).0, code::NONE);
    migration.migrate_the_rest();
    migration.finish();
    assert_eq!(read(&mut reader), (code::NONE, 3, 3), "read after the migration");
}

/// A master that is full (`maxmemory` under `noeviction`) holds the
/// transaction index and the producer-id counter, one key each for the
/// whole cluster: a transactional producer whose id and partition live on
/// the other masters still initialises, writes and commits. Both keys are
/// written by scripts Redis runs when full, as the heartbeats are; before,
/// the full master's OOM refusal of their plain ZADD and INCR failed every
/// InitProducerId and every AddPartitionsToTxn of the cluster.
#[test]
fn transactions_away_from_a_full_master_go_on_though_it_holds_their_index() {
    let mut cluster = RedisCluster::start(3, 0);
    let a = gateway(&cluster, "1");
    let full = cluster.master_of("ketch:transactions");
    let mut conn = KafkaConn::connect(a.kafka_addr());
    let topic = loop {
        let topic = unique_topic("cluster-full-index");
        assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
        if placement(&cluster, &topic)[0] != full {
            break topic;
        }
    };
    let id = (0..)
        .map(|n| format!("{}-{n}", unique_topic("txn-away")))
        .find(|id| cluster.master_of(&format!("ketch:txn:{{{id}}}")) != full)
        .expect("an id away from the full master");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut cluster.node_mut(full).connection())
        .expect("CONFIG SET");
    let full_counter = cluster.master_of("ketch:producer-ids") == full;

    let rt = runtime();
    let producer = a.producer_with(&[("transactional.id", &id)]);
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("InitProducerId");
    producer.begin_transaction().expect("begin");
    let sent: Vec<_> = (0..3)
        .map(|n| {
            producer
                .send_result(
                    FutureRecord::<(), _>::to(&topic)
                        .payload(&format!("t{n}"))
                        .partition(0),
                )
                .map_err(|(e, _)| e)
                .expect("queued")
        })
        .collect();
    producer
        .commit_transaction(Duration::from_secs(30))
        .expect("AddPartitionsToTxn and EndTxn");
    for delivery in sent {
        rt.block_on(delivery)
            .expect("delivered")
            .map_err(|(e, _)| e)
            .expect("stored");
    }
    // The commit's marker makes the records stable: the last stable offset
    // passes them (3 records and the marker).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = raw::list_offsets_request(&topic, 0, -1).with_isolation_level(1);
        let (error, stable, _) = raw::list_offsets_result(&conn.request(8, &request));
        assert_eq!(error, code::NONE);
        if stable == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the last stable offset stays at {stable}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let counter = cluster.master_of("ketch:producer-ids");
    let refused: redis::RedisResult<i64> = redis::cmd("INCR")
        .arg("ketch:producer-ids")
        .query(&mut cluster.node_mut(counter).connection());
    assert_eq!(
        refused.is_err(),
        full_counter,
        "the full master refuses plain writes: {refused:?}"
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut cluster.node_mut(full).connection())
        .expect("CONFIG SET");
}

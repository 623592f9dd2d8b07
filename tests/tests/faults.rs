//! Faults (issue #6): an idempotent producer keeps every record exactly
//! once, in per-partition send order, while gateways are SIGKILLed and
//! Redis is paused or SIGKILLed.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ketch_tests::{Ketch, RedisServer, runtime, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

const PARTITIONS: i32 = 4;

fn gateway(redis: &RedisServer, id: i32) -> Ketch {
    Ketch::start_node(&redis.url(), id, "1s", &["--set", "redis.command_timeout=2s"])
}

fn idempotent_producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "120000")
        .set("reconnect.backoff.max.ms", "200")
        .create()
        .expect("producer")
}

/// Produces `count` records round-robin over the partitions, value
/// `partition:seq`, while `disturb` runs once `progress` records are acked;
/// every delivery must succeed.
fn produce_through(producer: &FutureProducer, topic: &str, count: usize, disturb: impl FnOnce() + Send) {
    let acked = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        let watcher = {
            let acked = acked.clone();
            let done = done.clone();
            scope.spawn(move || {
                while acked.load(Ordering::Relaxed) < count / 4 && !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                // Measured as the fault begins: a gateway restarted with its
                // configured id waits for its crashed incarnation's lease to
                // expire (node_timeout), so the producer may be done by the
                // time every restart is.
                let during = !done.load(Ordering::Relaxed);
                let unacked = count - acked.load(Ordering::Relaxed);
                disturb();
                (during, unacked)
            })
        };
        let rt = runtime();
        let mut pending = Vec::with_capacity(count);
        for i in 0..count {
            let partition = (i % PARTITIONS as usize) as i32;
            let value = format!("{partition}:{}", i / PARTITIONS as usize);
            let delivery = producer
                .send_result(
                    FutureRecord::<(), _>::to(topic)
                        .payload(&value)
                        .partition(partition),
                )
                .map_err(|(e, _)| e)
                .expect("queued");
            pending.push(delivery);
            if pending.len() >= 2_000 {
                for delivery in pending.drain(..) {
                    rt.block_on(delivery)
                        .expect("delivered")
                        .map_err(|(e, _)| e)
                        .expect("acknowledged");
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        for delivery in pending {
            rt.block_on(delivery)
                .expect("delivered")
                .map_err(|(e, _)| e)
                .expect("acknowledged");
        }
        done.store(true, Ordering::Relaxed);
        let (during, unacked) = watcher.join().expect("disturbance");
        assert!(
            during && unacked > 0,
            "the fault must begin while the producer is still sending ({unacked} unacked)"
        );
    });
}

/// Every partition holds exactly `partition:0..n` in order.
fn assert_exactly_once_in_order(via: &Ketch, topic: &str, count: usize) {
    let per_partition = count / PARTITIONS as usize;
    let consumer = via.consumer_at(topic, &(0..PARTITIONS).collect::<Vec<_>>(), 0);
    let mut next = vec![0usize; PARTITIONS as usize];
    let deadline = Instant::now() + Duration::from_secs(120);
    while next.iter().sum::<usize>() < count {
        assert!(Instant::now() < deadline, "consumed only {next:?}");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("consume");
        let p = message.partition() as usize;
        let value = std::str::from_utf8(message.payload().expect("value")).expect("utf-8");
        assert_eq!(
            value,
            format!("{p}:{}", next[p]),
            "partition {p} at offset {}",
            message.offset()
        );
        assert_eq!(message.offset(), next[p] as i64, "dense offsets");
        next[p] += 1;
    }
    assert!(next.iter().all(|n| *n == per_partition), "{next:?}");
}

#[test]
fn gateways_killed_three_times_lose_and_duplicate_nothing() {
    let redis = RedisServer::start();
    let mut a = gateway(&redis, 1);
    let mut b = gateway(&redis, 2);
    let topic = unique_topic("faults-gateways");
    a.create_topic(&runtime(), &topic, PARTITIONS);
    let producer = idempotent_producer(&format!("{},{}", a.bootstrap(), b.bootstrap()));
    produce_through(&producer, &topic, 200_000, || {
        for first in [true, false, true] {
            let gateway = if first { &mut a } else { &mut b };
            gateway.kill9();
            gateway.restart();
        }
    });
    assert_exactly_once_in_order(&a, &topic, 200_000);
}

#[test]
fn redis_paused_for_five_seconds_loses_and_duplicates_nothing() {
    let redis = RedisServer::start();
    let ketch = gateway(&redis, 1);
    let topic = unique_topic("faults-pause");
    ketch.create_topic(&runtime(), &topic, PARTITIONS);
    let producer = idempotent_producer(&ketch.bootstrap());
    let pid = redis.pid().to_string();
    produce_through(&producer, &topic, 100_000, || {
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("SIGSTOP");
        std::thread::sleep(Duration::from_secs(5)); // the fault's length, not a synchronisation
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .expect("SIGCONT");
    });
    assert_exactly_once_in_order(&ketch, &topic, 100_000);
}

#[test]
fn redis_killed_with_fsync_always_keeps_every_acknowledged_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_arg = dir.path().to_str().expect("utf-8 path").to_owned();
    let mut redis = RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &dir_arg,
    ]);
    let ketch = gateway(&redis, 1);
    let topic = unique_topic("faults-aof");
    ketch.create_topic(&runtime(), &topic, PARTITIONS);
    let producer = idempotent_producer(&ketch.bootstrap());
    produce_through(&producer, &topic, 40_000, || {
        redis.stop(); // SIGKILL
        redis.start_again(); // reloads the append-only file
    });
    assert_exactly_once_in_order(&ketch, &topic, 40_000);
}

/// A produce answered REQUEST_TIMED_OUT at its deadline while Redis is
/// paused; Redis stores the batch once it runs again. A fetch tailing the
/// partition through the same gateway reads it: the gateway forgets what it
/// knew of the partition when an append's reply never came (it was told
/// "nothing new" until the next append, since the append script announces
/// an append only to other gateways).
#[test]
fn a_produce_never_waits_past_its_timeout() {
    use ketch_tests::batch;
    use ketch_tests::raw::{self, FETCH_VERSION, code};
    let redis = RedisServer::start();
    let ketch = gateway(&redis, 1);
    let mut conn = raw::KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("faults-timeout");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), 0);
    let first = batch::encode(&[batch::Record::value(batch::at(0), b"first")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, first), (code::NONE, 0));
    // Tailing at 1: the gateway subscribes to the partition and knows it
    // ends there.
    for _ in 0..2 {
        let tail = conn.request(FETCH_VERSION, &raw::fetch_request(&topic, 0, 1, 200));
        assert_eq!(raw::fetch_result(&tail).1, 1);
    }
    let pid = redis.pid().to_string();
    Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("SIGSTOP");
    let late = batch::encode(&[batch::Record::value(batch::at(1), b"late")]);
    let request = raw::produce_request(&topic, 0, late).with_timeout_ms(300);
    let started = Instant::now();
    let response = conn.request(raw::PRODUCE_VERSION, &request);
    let waited = started.elapsed();
    Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .expect("SIGCONT");
    const REQUEST_TIMED_OUT: i16 = 7;
    assert_eq!(raw::produce_result(&response).0, REQUEST_TIMED_OUT);
    assert!(
        waited < Duration::from_millis(1500),
        "answered after {waited:?}, timeout 300 ms"
    );
    // Redis stored it at 1 once it ran again: a fetch here reads it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tail = conn.request(FETCH_VERSION, &raw::fetch_request(&topic, 0, 1, 500));
        let (error, high_watermark, records) = raw::fetch_result(&tail);
        assert_eq!(error, code::NONE);
        if records.is_some_and(|r| !r.is_empty()) {
            assert_eq!(high_watermark, 2);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the batch stored after the timeout is never read here (high watermark {high_watermark})"
        );
    }
}

/// While Redis does not answer (paused, as in a failover), a topic's
/// configs are answered from the gateway's last record of the topic, and a
/// topic creation is REQUEST_TIMED_OUT, both as Kafka answers (from its
/// metadata cache; a controller that could not commit in time): Kafka
/// Connect checks its topics' configs at every start, and Connect's and
/// Kafka Streams' topic set-up retries a timeout. Both were
/// KAFKA_STORAGE_ERROR, which stopped a Connect worker's start and shut a
/// Streams instance down.
#[test]
fn topic_configs_and_creations_while_redis_is_paused_are_answered_as_kafka_does() {
    use kafka_protocol::messages::DescribeConfigsRequest;
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use ketch_tests::raw::{self, KafkaConn};

    let redis = RedisServer::start();
    let ketch = gateway(&redis, 1);
    let topic = unique_topic("faults-configs");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), 0);
    let describe = |conn: &mut KafkaConn| {
        let response = conn.request(
            4,
            &DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(kafka_protocol::protocol::StrBytes::from_string(topic.clone()))
                    .with_configuration_keys(None),
            ]),
        );
        let result = response.results[0].clone();
        let policy = result
            .configs
            .iter()
            .find(|c| c.name.as_str() == "cleanup.policy")
            .and_then(|c| c.value.as_ref().map(|v| v.to_string()));
        (result.error_code, policy)
    };
    assert_eq!(describe(&mut conn), (0, Some("delete".to_owned())));

    let frozen = ketch_tests::Frozen::freeze(redis.pid());
    assert_eq!(
        describe(&mut conn),
        (0, Some("delete".to_owned())),
        "DescribeConfigs from the last record"
    );
    let created = raw::create_topic(&mut conn, &unique_topic("faults-create"), 1);
    assert_eq!(created, 7, "CreateTopics: REQUEST_TIMED_OUT");
    drop(frozen);
}

/// A wake-up subscription whose connection goes silent without closing (a
/// NAT or load balancer that dropped the idle flow) is found out by its
/// PINGs going unanswered and opened again: a consumer long-polling one
/// gateway gets what another gateway appends. Before, its channels stayed
/// "subscribed" on the dead connection, each fetch trusted announcements
/// that no longer came, and the consumer got nothing new for good.
#[test]
fn a_silent_wake_up_connection_is_found_out_and_opened_again() {
    use ketch_tests::proxy::DelayProxy;
    use ketch_tests::raw::{self, KafkaConn, code};
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(([127, 0, 0, 1], redis.port()).into(), Duration::ZERO);
    let behind = Ketch::start(&proxy.redis_url(), &[]);
    let direct = Ketch::start(&redis.url(), &[]);
    let mut producer = KafkaConn::connect(direct.kafka_addr());
    let mut consumer = KafkaConn::connect(behind.kafka_addr());
    let topic = unique_topic("silent-wake");
    assert_eq!(raw::create_topic(&mut producer, &topic, 1), code::NONE);
    let record = |n: i64| {
        ketch_tests::batch::encode(&[ketch_tests::batch::Record::value(ketch_tests::batch::at(n), b"v")])
    };
    // Records appended through the direct gateway reach a fetch waiting on
    // the one behind the proxy, within `deadline`.
    let mut received = |offset: i64, deadline: Duration| -> bool {
        let until = Instant::now() + deadline;
        while Instant::now() < until {
            let response = consumer.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, offset, 500));
            let (error, _, records) = raw::fetch_result(&response);
            assert_eq!(error, code::NONE);
            if records.is_some_and(|r| !r.is_empty()) {
                return true;
            }
        }
        false
    };
    assert!(!received(0, Duration::from_millis(600)), "nothing yet");
    assert_eq!(raw::produce(&mut producer, &topic, 0, record(0)), (code::NONE, 0));
    assert!(received(0, Duration::from_secs(10)), "the first record");
    proxy.silence_subscribers();
    assert_eq!(raw::produce(&mut producer, &topic, 0, record(1)), (code::NONE, 1));
    assert!(
        received(1, Duration::from_secs(40)),
        "a record appended after the subscription went silent never came"
    );
}

/// A failover behind one address (a DNS name or virtual IP that now leads
/// to the promoted replica): the old master, demoted, keeps its clients'
/// connections open and refuses their writes as READONLY. The gateway
/// dials again on READONLY and reaches the new master; before, every write
/// was refused until the gateway restarted.
#[test]
fn a_master_demoted_behind_one_address_is_left_for_the_new_one() {
    use ketch_tests::proxy::DelayProxy;
    use ketch_tests::raw::{self, KafkaConn, code};
    let old = RedisServer::start();
    let new = RedisServer::start_replica_of(&old);
    new.wait_for_replication("master_link_status:up");
    let proxy = DelayProxy::start(([127, 0, 0, 1], old.port()).into(), Duration::ZERO);
    // acks=all waits for the replica: what the old master has, the new one
    // has when it is promoted.
    let ketch = Ketch::start(&proxy.redis_url(), &["--set", "storage.acks_all_replicas=1"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("demoted");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let record = |n: i64| {
        ketch_tests::batch::encode(&[ketch_tests::batch::Record::value(ketch_tests::batch::at(n), b"v")])
    };
    let first = raw::produce_request(&topic, 0, record(0)).with_acks(-1);
    assert_eq!(
        raw::produce_result(&conn.request(raw::PRODUCE_VERSION, &first)),
        (code::NONE, 0)
    );
    // What `redis-cli` would do at a failover, with the address moved.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut new.connection())
        .expect("promote");
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new.port())
        .query(&mut old.connection())
        .expect("demote");
    proxy.set_server(([127, 0, 0, 1], new.port()).into());
    // The client retries, as a producer does, until a write is stored.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (error, offset) = raw::produce(&mut conn, &topic, 0, record(1));
        if error == code::NONE {
            assert_eq!(offset, 1, "after the record the old master had");
            break;
        }
        assert!(Instant::now() < deadline, "writes still refused ({error})");
        std::thread::sleep(Duration::from_millis(100));
    }
}

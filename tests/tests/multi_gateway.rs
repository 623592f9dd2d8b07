//! Two gateways on one Redis: appends through both to one partition get
//! dense, unique offsets (the append script assigns them), and a fetch parked
//! on one gateway is woken by a produce through the other (sharded pub/sub).
//!
//! Raw protocol on purpose: rdkafka would follow Metadata to the partition's
//! leader, and these tests need each request to go to a chosen gateway.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, quantile, unique_topic};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;

const WRITERS_PER_GATEWAY: usize = 2;
const BATCHES_PER_WRITER: usize = 150;
const RECORDS_PER_BATCH: usize = 10;

/// A record's value. Writers 0 and 1 (one on each gateway) write batches
/// of about 5 KiB, which take the staged path (a reserve that another
/// gateway's append can move, then a retry); the others small, inline ones.
fn value(writer: usize, batch: usize, record: usize) -> Vec<u8> {
    let mut value = format!("w{writer}-b{batch}-r{record}").into_bytes();
    if writer < 2 {
        value.resize(500, b'.');
    }
    value
}

/// A Redis, gateways A (node 1) and B (node 2) on it, and a topic of one
/// partition named from `prefix`, created through A.
fn two_gateways(prefix: &str) -> (TestRedis, Ketch, Ketch, String) {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &["--node-id", "1"]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    let topic = unique_topic(prefix);
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(a.kafka_addr()), &topic, 1),
        code::NONE
    );
    (redis, a, b, topic)
}

#[test]
fn concurrent_appends_through_two_gateways_get_dense_unique_offsets() {
    let (_redis, a, b, topic) = two_gateways("two-gateways");

    let writers: Vec<_> = (0..2 * WRITERS_PER_GATEWAY)
        .map(|writer| {
            let addr = if writer % 2 == 0 {
                a.kafka_addr()
            } else {
                b.kafka_addr()
            };
            let topic = topic.clone();
            thread::spawn(move || {
                let mut conn = KafkaConn::connect(addr);
                (0..BATCHES_PER_WRITER)
                    .map(|n| {
                        let records: Vec<Record> = (0..RECORDS_PER_BATCH)
                            .map(|r| Record::value(batch::at(n as i64), &value(writer, n, r)))
                            .collect();
                        let (error, base_offset) =
                            raw::produce(&mut conn, &topic, 0, batch::encode(&records));
                        assert_eq!(error, code::NONE, "writer {writer} batch {n}");
                        (base_offset, (writer, n))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut acked: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
    for writer in writers {
        for (base_offset, who) in writer.join().expect("writer thread") {
            assert!(
                acked.insert(base_offset, who).is_none(),
                "base offset {base_offset} acked twice"
            );
        }
    }

    // Dense and gap-free: the acked batches tile [0, total).
    let total = (2 * WRITERS_PER_GATEWAY * BATCHES_PER_WRITER * RECORDS_PER_BATCH) as i64;
    let mut expected_base = 0;
    for &base in acked.keys() {
        assert_eq!(base, expected_base, "gap or overlap at offset {expected_base}");
        expected_base += RECORDS_PER_BATCH as i64;
    }
    assert_eq!(expected_base, total);

    // Every acknowledged record is readable at its offset.
    let consumer = a.consumer_at(&topic, &[0], 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 0i64;
    while next < total {
        assert!(Instant::now() < deadline, "consumed only {next} of {total}");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("consume");
        assert_eq!(message.offset(), next);
        let base = next - next % RECORDS_PER_BATCH as i64;
        let (writer, n) = acked[&base];
        let want = value(writer, n, (next - base) as usize);
        assert_eq!(
            message.payload(),
            Some(want.as_slice()),
            "record at offset {next}"
        );
        next += 1;
    }
    let (low, high) = consumer
        .fetch_watermarks(&topic, 0, Duration::from_secs(10))
        .expect("watermarks");
    assert_eq!((low, high), (0, total));
}

#[test]
fn fetch_waiting_on_one_gateway_wakes_for_a_produce_through_another() {
    const TRIALS: usize = 200;
    let (_redis, a, b, topic) = two_gateways("wake");

    // The consumer thread parks a Fetch (max_wait 5 s) on gateway A at the
    // offset it is told, and reports when the answer arrived.
    let (to_consumer, offsets) = mpsc::channel::<i64>();
    let (sent_tx, sent) = mpsc::channel::<()>();
    let (answer_tx, answers) = mpsc::channel::<(Instant, i16, i64)>();
    let consumer_addr = a.kafka_addr();
    let consumer_topic = topic.clone();
    let consumer = thread::spawn(move || {
        let mut conn = KafkaConn::connect(consumer_addr);
        for offset in offsets {
            conn.send(
                raw::FETCH_VERSION,
                &raw::fetch_request(&consumer_topic, 0, offset, 5_000),
            );
            sent_tx.send(()).expect("report sent");
            let response = conn.receive::<kafka_protocol::messages::FetchRequest>(raw::FETCH_VERSION);
            let arrived = Instant::now();
            let (error, _, records) = raw::fetch_result(&response);
            let count = records.as_deref().map_or(0, raw::count_records);
            answer_tx.send((arrived, error, count)).expect("report answer");
        }
    });

    let mut producer = KafkaConn::connect(b.kafka_addr());
    let mut after_ack = Vec::with_capacity(TRIALS);
    let mut after_send = Vec::with_capacity(TRIALS);
    for trial in 0..TRIALS {
        to_consumer.send(trial as i64).expect("start fetch");
        sent.recv().expect("fetch sent");
        // The fetch has reached A (it parks at once, at the end it knows).
        a.await_inflight_requests(1);
        let send_at = Instant::now();
        let (error, offset) = raw::produce(
            &mut producer,
            &topic,
            0,
            batch::encode(&[Record::value(batch::at(trial as i64), b"ping")]),
        );
        let ack_at = Instant::now();
        assert_eq!((error, offset), (code::NONE, trial as i64));
        let (arrived, error, count) = answers
            .recv_timeout(Duration::from_secs(10))
            .expect("fetch answer");
        assert_eq!((error, count), (code::NONE, 1), "trial {trial}");
        after_ack.push(arrived.saturating_duration_since(ack_at));
        after_send.push(arrived.saturating_duration_since(send_at));
    }
    drop(to_consumer);
    consumer.join().expect("consumer thread");

    let p50 = quantile(&mut after_ack, 0.50);
    let p99 = quantile(&mut after_ack, 0.99);
    let max = quantile(&mut after_ack, 1.0);
    let send_p99 = quantile(&mut after_send, 0.99);
    eprintln!(
        "cross-gateway wake over {TRIALS} trials: produce-ack -> fetch answer p50 {p50:?} p99 {p99:?} max {max:?}; \
         produce-send -> fetch answer p99 {send_p99:?}"
    );
    assert!(p99 < Duration::from_millis(50), "p99 {p99:?} >= 50 ms");
}

/// An append is announced on its partition's channel only when a gateway
/// other than the appending one listens there: the appending gateway wakes
/// its own fetches itself, and Redis, counting the subscribers of the
/// channel and of that gateway's presence channel, leaves the message out.
/// Once a second gateway waits on the partition, appends are announced and
/// its fetch wakes at once.
#[test]
fn appends_are_announced_only_when_another_gateway_listens() {
    const ALONE: i64 = 20;
    let (redis, a, b, topic) = two_gateways("announce");
    let tag = redis.topic_tags(&topic).remove(0);
    let channel = format!("ketch:{{{tag}}}:wake");
    // The channel and each gateway's presence channel for it, once `want`
    // gateways hold both.
    let wait_for_listeners = |want: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let held = redis.shard_channels(&format!("{channel}*"));
            let presences = held.iter().filter(|(c, n)| **c != channel && **n == 1).count();
            if held.get(&channel) == Some(&(want as u64)) && presences == want {
                return;
            }
            assert!(Instant::now() < deadline, "listeners on {channel}: {held:?}");
            thread::sleep(Duration::from_millis(10));
        }
    };
    let fetch = |conn: &mut KafkaConn, offset: i64| {
        conn.send(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, offset, 5_000));
    };
    let fetched = |conn: &mut KafkaConn| {
        let response = conn.receive::<kafka_protocol::messages::FetchRequest>(raw::FETCH_VERSION);
        let (error, _, records) = raw::fetch_result(&response);
        (error, records.as_deref().map_or(0, raw::count_records))
    };

    // One record through A, expected at `offset`.
    let append = |producer: &mut KafkaConn, offset: i64| {
        let batch = batch::encode(&[Record::value(batch::at(offset), b"announce")]);
        assert_eq!(raw::produce(producer, &topic, 0, batch), (code::NONE, offset));
    };

    // A consumer long-polls through A, which appends too: nobody else listens.
    let mut consumer_a = KafkaConn::connect(a.kafka_addr());
    let mut producer = KafkaConn::connect(a.kafka_addr());
    let announced = redis.command_calls("spublish");
    for offset in 0..ALONE {
        fetch(&mut consumer_a, offset);
        if offset == 0 {
            wait_for_listeners(1);
        }
        append(&mut producer, offset);
        assert_eq!(fetched(&mut consumer_a), (code::NONE, 1), "offset {offset}");
    }
    assert_eq!(
        redis.command_calls("spublish") - announced,
        0,
        "appends announced with only the appending gateway listening"
    );

    // B waits on the partition too: A's next append is announced, and B's
    // fetch (up to 5 s) is answered as soon as it is.
    let mut consumer_b = KafkaConn::connect(b.kafka_addr());
    fetch(&mut consumer_b, ALONE);
    fetch(&mut consumer_a, ALONE);
    wait_for_listeners(2);
    append(&mut producer, ALONE);
    let acked = Instant::now();
    assert_eq!(fetched(&mut consumer_b), (code::NONE, 1));
    let waited = acked.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "B's fetch answered after {waited:?}"
    );
    assert_eq!(fetched(&mut consumer_a), (code::NONE, 1));
    assert!(redis.command_calls("spublish") - announced >= 1);
}

/// DeleteTopics v6 by topic id: its error code.
fn delete_by_id(conn: &mut KafkaConn, id: uuid::Uuid) -> i16 {
    let request = kafka_protocol::messages::DeleteTopicsRequest::default()
        .with_topics(vec![
            kafka_protocol::messages::delete_topics_request::DeleteTopicState::default().with_topic_id(id),
        ])
        .with_timeout_ms(10_000);
    let response: kafka_protocol::messages::DeleteTopicsResponse = conn.request(6, &request);
    response.responses[0].error_code
}

/// A DeleteTopics by the id of a topic deleted and created again under the
/// same name through another gateway deletes nothing: the id is unknown,
/// and the new topic keeps its records.
#[test]
fn deleting_by_a_stale_topic_id_leaves_the_new_topic_of_that_name() {
    let (redis, a, b, topic) = two_gateways("recreated");
    let (mut via_a, mut via_b) = (
        KafkaConn::connect(a.kafka_addr()),
        KafkaConn::connect(b.kafka_addr()),
    );
    let old = raw::topic_id(&mut via_a, &topic).expect("the topic, through a");
    let delete_by_name = kafka_protocol::messages::DeleteTopicsRequest::default()
        .with_topics(vec![
            kafka_protocol::messages::delete_topics_request::DeleteTopicState::default()
                .with_name(Some(raw::topic_name(&topic))),
        ])
        .with_timeout_ms(10_000);
    let deleted: kafka_protocol::messages::DeleteTopicsResponse = via_b.request(6, &delete_by_name);
    assert_eq!(deleted.responses[0].error_code, code::NONE);
    assert_eq!(raw::create_topic(&mut via_b, &topic, 1), code::NONE);
    let kept = batch::encode(&[batch::Record::value(batch::at(1), b"kept")]);
    assert_eq!(raw::produce(&mut via_b, &topic, 0, kept), (code::NONE, 0));
    // Gateway a learns of the new topic (its cache lives half a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let new = loop {
        match raw::topic_id(&mut via_a, &topic) {
            Some(id) if id != old => break id,
            _ => assert!(std::time::Instant::now() < deadline, "a never saw the new topic"),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    const UNKNOWN_TOPIC_ID: i16 = 100;
    assert_eq!(delete_by_id(&mut via_a, old), UNKNOWN_TOPIC_ID);
    assert_eq!(raw::topic_id(&mut via_a, &topic), Some(new));
    assert_eq!(redis.next_offset(&topic, 0), 1, "the new topic's record");
}

/// CreatePartitions through one gateway while configs of the same topic
/// change through another: every growth succeeds (the record changing
/// between its read and its write is read again, as Kafka's controller
/// takes the changes one at a time), none fails with a reassignment error.
#[test]
fn partitions_grow_while_configs_change_through_another_gateway() {
    let (_redis, a, b, topic) = two_gateways("grow-while-altered");
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            let mut conn = KafkaConn::connect(b.kafka_addr());
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let code =
                    raw::set_topic_config(&mut conn, &topic, "retention.ms", &(3_600_000 + n).to_string());
                assert_eq!(code, code::NONE);
                // A busy operator, not a flood: a change every 20 ms.
                thread::sleep(Duration::from_millis(20));
            }
        });
        let mut conn = KafkaConn::connect(a.kafka_addr());
        for count in 2..=15 {
            let request = kafka_protocol::messages::CreatePartitionsRequest::default()
                .with_topics(vec![
                    kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default()
                        .with_name(raw::topic_name(&topic))
                        .with_count(count)
                        .with_assignments(None),
                ])
                .with_timeout_ms(10_000);
            let response: kafka_protocol::messages::CreatePartitionsResponse = conn.request(3, &request);
            let result = &response.results[0];
            let outcome = (result.error_code, result.error_message.clone());
            if result.error_code != code::NONE {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            assert_eq!(outcome.0, code::NONE, "growing to {count}: {outcome:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
}

/// Two CreatePartitions of one topic at once, through two gateways: one
/// grows it, the other is INVALID_PARTITIONS (as Kafka's controller takes
/// them one at a time), and the partition added is whole: its keys were
/// named alike by both, and the loser removed (or reset) the winner's.
#[test]
fn concurrent_growths_of_a_topic_leave_the_winners_partitions() {
    const INVALID_PARTITIONS: i16 = 37;
    let (_redis, a, b, _) = two_gateways("grow-twice");
    let grow = |addr, topic: &str| {
        let request = kafka_protocol::messages::CreatePartitionsRequest::default()
            .with_topics(vec![
                kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(raw::topic_name(topic))
                    .with_count(2)
                    .with_assignments(None),
            ])
            .with_timeout_ms(10_000);
        let response: kafka_protocol::messages::CreatePartitionsResponse =
            KafkaConn::connect(addr).request(3, &request);
        response.results[0].error_code
    };
    let mut conn = KafkaConn::connect(a.kafka_addr());
    for round in 0..20 {
        let topic = unique_topic(&format!("grow-twice-{round}"));
        assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
        let barrier = std::sync::Barrier::new(2);
        let mut codes: Vec<i16> = thread::scope(|s| {
            let growths: Vec<_> = [a.kafka_addr(), b.kafka_addr()]
                .into_iter()
                .map(|addr| {
                    let (barrier, topic) = (&barrier, &topic);
                    s.spawn(move || {
                        barrier.wait();
                        grow(addr, topic)
                    })
                })
                .collect();
            growths.into_iter().map(|g| g.join().expect("growth")).collect()
        });
        codes.sort_unstable();
        assert_eq!(codes, [code::NONE, INVALID_PARTITIONS], "round {round}");
        for offset in 0..2 {
            let record = batch::encode(&[Record::value(batch::at(offset), b"new partition")]);
            assert_eq!(
                raw::produce(&mut conn, &topic, 1, record),
                (code::NONE, offset),
                "round {round}: the new partition takes records"
            );
        }
    }
}

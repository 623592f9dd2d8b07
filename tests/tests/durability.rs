//! acks=all with `storage.acks_all_replicas` (issue #6, part): the
//! acknowledgement waits for a real Redis replica; without it the producer
//! gets NOT_ENOUGH_REPLICAS_AFTER_APPEND, and an idempotent retry succeeds,
//! stored once, when the replica is back.

use std::time::{Duration, Instant};

use kafka_protocol::messages::{InitProducerIdRequest, ProducerId};
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, unique_topic};

const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;

/// Polls `INFO replication` of `server` until it contains `line`: the
/// replication link has no other observable event.
fn wait_for_replication(server: &RedisServer, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut server.connection())
            .unwrap();
        if info.lines().any(|l| l.trim() == line) {
            return;
        }
        assert!(Instant::now() < deadline, "no `{line}` in:\n{info}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn produce_acks_all(conn: &mut KafkaConn, topic: &str, batch: Vec<u8>) -> (i16, i64) {
    let request = raw::produce_request(topic, 0, batch).with_acks(-1);
    raw::produce_result(&conn.request(raw::PRODUCE_VERSION, &request))
}

#[test]
fn acks_all_waits_for_the_replica_and_fails_retriably_without_it() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    wait_for_replication(&replica, "master_link_status:up");
    let ketch = Ketch::start(
        &primary.url(),
        &[
            "--set",
            "storage.acks_all_replicas=1",
            "--set",
            "storage.acks_all_timeout=300ms",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("acks-all");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let init = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let producer_id = conn.request(4, &init).producer_id.0;
    let batch =
        |n: i32| batch::encode_idempotent(&[Record::value(1, format!("r{n}").as_bytes())], producer_id, 0, n);

    assert_eq!(produce_acks_all(&mut conn, &topic, batch(0)), (code::NONE, 0));
    // What was acknowledged is on the replica.
    let on_replica: i64 = redis::cmd("XLEN")
        .arg(format!("ketch:{{{}}}:log", primary.topic_tags(&topic)[0]))
        .query(&mut replica.connection())
        .unwrap();
    assert_eq!(on_replica, 1);

    replica.stop();
    wait_for_replication(&primary, "connected_slaves:0");
    let (error, _) = produce_acks_all(&mut conn, &topic, batch(1));
    assert_eq!(error, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    // acks=1 does not wait.
    let plain = raw::produce(&mut conn, &topic, 0, batch::encode(&[Record::value(2, b"plain")]));
    assert_eq!(plain.0, code::NONE);

    replica.start_again();
    wait_for_replication(&replica, "master_link_status:up");
    // The client's retry of the refused batch: stored once, at its first offset.
    assert_eq!(produce_acks_all(&mut conn, &topic, batch(1)), (code::NONE, 1));
    assert_eq!(primary.next_offset(&topic, 0), 3);
}

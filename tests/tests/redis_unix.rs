//! Redis on a Unix socket (`redis.url = unix:///path?pass=…`): a gateway
//! on the same host as Redis reaches it without TCP, its data path, its
//! acks=all connections and its wake-up subscriptions all on the socket,
//! beside gateways that reach the same Redis over TCP.

use std::time::{Duration, Instant};

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, assert_fetch_wakes_across, unique_topic};

/// Redis's clients connected through its Unix socket.
fn unix_clients(redis: &RedisServer) -> usize {
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.connection())
        .unwrap();
    // A Unix socket client's address is the socket's path (`addr=/…:0`).
    clients.lines().filter(|line| line.contains(" addr=/")).count()
}

#[test]
fn gateways_on_a_unix_socket_and_on_tcp_share_one_redis() {
    let redis = RedisServer::start_unix(&["--requirepass", "s3cret"]);
    let url = redis.unix_url();
    assert!(
        url.starts_with("unix:///") && url.ends_with("?pass=s3cret"),
        "{url}"
    );
    let a = Ketch::start(&url, &["--node-id", "1"]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    // Appends through a wake a fetch parked on b, and the other way round:
    // a has no other way to Redis than its socket.
    assert_fetch_wakes_across(&a, &b, 2);
    assert_fetch_wakes_across(&b, &a, 2);
    assert!(unix_clients(&redis) >= 2, "a's connections, on the socket");
}

#[test]
fn acks_all_waits_for_a_replica_over_the_unix_socket() {
    let primary = RedisServer::start_unix(&[]);
    let replica = RedisServer::start_replica_of(&primary);
    replica.wait_for_replication("master_link_status:up");
    let ketch = Ketch::start(
        &primary.unix_url(),
        &[
            "--set",
            "storage.acks_all_replicas=1",
            "--set",
            "storage.acks_all_timeout=2s",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("unix-acks-all");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for n in 0..3 {
        let batch = batch::encode(&[Record::value(batch::at(1), format!("r{n}").as_bytes())]);
        let request = raw::produce_request(&topic, 0, batch).with_acks(-1);
        let answer = raw::produce_result(&conn.request(raw::PRODUCE_VERSION, &request));
        assert_eq!(answer, (code::NONE, n));
    }
    // What was acknowledged is on the replica.
    let on_replica: i64 = redis::cmd("XLEN")
        .arg(format!("ketch:{{{}}}:log", primary.topic_tags(&topic)[0]))
        .query(&mut replica.connection())
        .unwrap();
    assert_eq!(on_replica, 3);
}

#[test]
fn a_gateway_started_before_redis_reaches_its_socket_once_it_is_there() {
    let mut redis = RedisServer::reserve_unix(&[]);
    let ketch = Ketch::start(&redis.unix_url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("unix-late");
    // Nothing listens on the socket yet: a retriable error, not a hang.
    let error = raw::create_topic(&mut conn, &topic, 1);
    assert!(
        code::RETRIABLE.contains(&error),
        "CreateTopics without Redis: {error}"
    );
    assert_eq!(ketch.http_get("/ready").0, 503);

    redis.start_again();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ketch.http_get("/ready").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "not ready 30 s after Redis started:\n{}",
            ketch.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let record = batch::encode(&[Record::value(batch::at(1), b"late")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, record), (code::NONE, 0));
    assert_eq!(redis.stream_len(&topic, 0), 1);
}

//! TLS to Redis (issue #11): `rediss://` URLs with `redis.tls_ca_file`, on
//! one server with a password and on a Redis Cluster speaking TLS on its
//! bus. Everything ketch sends goes over TLS, wake-up subscriptions
//! included: a long-poll on one gateway is woken by an append through
//! another. A CA file that cannot be read is refused at start, naming the
//! setting.

use std::time::{Duration, Instant};

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisCluster, RedisServer, TestCa, unique_topic};

/// Produces `first` on every partition through `a`, then checks that a
/// fetch parked on `b` at the end of each partition wakes for an append
/// through `a`, and returns both records.
fn produce_and_wake(a: &Ketch, b: &Ketch, partitions: i32) {
    let topic = unique_topic("tls");
    let mut conn_a = KafkaConn::connect(a.kafka_addr());
    let mut conn_b = KafkaConn::connect(b.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn_a, &topic, partitions), code::NONE);
    for partition in 0..partitions {
        let first = batch::encode(&[Record::value(1, b"first")]);
        assert_eq!(
            raw::produce(&mut conn_a, &topic, partition, first),
            (code::NONE, 0)
        );
        let response = conn_b.request(12, &raw::fetch_request(&topic, partition, 0, 0));
        let (error, high_watermark, records) = raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (code::NONE, 1));
        assert_eq!(raw::count_records(&records.expect("records")), 1);

        let (elapsed, response) = std::thread::scope(|s| {
            let fetch = s.spawn(|| {
                let started = Instant::now();
                let response = conn_b.request(12, &raw::fetch_request(&topic, partition, 1, 20_000));
                (started.elapsed(), response)
            });
            // Only makes it likely the fetch is parked first; it passes
            // either way when wake-ups work.
            std::thread::sleep(Duration::from_millis(300));
            let second = batch::encode(&[Record::value(2, b"second")]);
            assert_eq!(
                raw::produce(&mut conn_a, &topic, partition, second),
                (code::NONE, 1)
            );
            fetch.join().expect("fetch thread")
        });
        let (error, high_watermark, records) = raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (code::NONE, 2));
        assert_eq!(raw::count_records(&records.expect("records")), 1);
        assert!(
            elapsed < Duration::from_secs(10),
            "partition {partition}: the fetch waited {elapsed:?} instead of waking"
        );
    }
}

#[test]
fn gateways_use_a_password_protected_redis_over_tls_only() {
    let ca = TestCa::new();
    let redis = RedisServer::start_tls(&ca, &["--requirepass", "s3cret"]);
    let url = redis.tls_url();
    assert!(url.starts_with("rediss://:s3cret@"), "{url}");
    let ca_setting = format!("redis.tls_ca_file={}", ca.ca_file().display());
    let a = Ketch::start(&url, &["--node-id", "1", "--set", &ca_setting]);
    let b = Ketch::start(&url, &["--node-id", "2", "--set", &ca_setting]);
    produce_and_wake(&a, &b, 2);
}

#[test]
fn a_gateway_in_cluster_mode_uses_tls_to_every_node() {
    let ca = TestCa::new();
    let cluster = RedisCluster::start_tls(&ca, 3, 0);
    let ca_setting = format!("redis.tls_ca_file={}", ca.ca_file().display());
    let args = |id: &'static str| -> Vec<String> {
        [
            "--node-id",
            id,
            "--set",
            "redis.mode=cluster",
            "--set",
            &ca_setting,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let start = |id| {
        let args = args(id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Ketch::start(&cluster.tls_url(), &args)
    };
    let (a, b) = (start("1"), start("2"));
    produce_and_wake(&a, &b, 3);
}

#[test]
fn an_unreadable_ca_file_is_refused_at_start() {
    let output = Ketch::start_expecting_failure(
        "rediss://127.0.0.1:1",
        &["--set", "redis.tls_ca_file=/nonexistent/ca.pem"],
    );
    assert!(output.contains("redis.tls_ca_file"), "{output}");
    let output = Ketch::start_expecting_failure(
        "redis://127.0.0.1:1",
        &["--set", "redis.tls_ca_file=/etc/hostname"],
    );
    assert!(output.contains("rediss://"), "{output}");
}

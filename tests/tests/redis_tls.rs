//! TLS to Redis (issue #11): `rediss://` URLs with `redis.tls_ca_file`, on
//! one server with a password and on a Redis Cluster speaking TLS on its
//! bus. Everything ketch sends goes over TLS, wake-up subscriptions
//! included: a long-poll on one gateway is woken by an append through
//! another. A CA file that cannot be read is refused at start, naming the
//! setting.

use ketch_tests::{Ketch, RedisCluster, RedisServer, TestCa, assert_fetch_wakes_across};

#[test]
fn gateways_use_a_password_protected_redis_over_tls_only() {
    let ca = TestCa::new();
    let redis = RedisServer::start_tls(&ca, &["--requirepass", "s3cret"]);
    let url = redis.tls_url();
    assert!(url.starts_with("rediss://:s3cret@"), "{url}");
    let ca_setting = format!("redis.tls_ca_file={}", ca.ca_file().display());
    let a = Ketch::start(&url, &["--node-id", "1", "--set", &ca_setting]);
    let b = Ketch::start(&url, &["--node-id", "2", "--set", &ca_setting]);
    assert_fetch_wakes_across(&a, &b, 2);
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
    assert_fetch_wakes_across(&a, &b, 3);
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

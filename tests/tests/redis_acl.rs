//! A Redis user limited to ketch's namespace, as docs/security.md ("Redis")
//! gives it: keys and sharded channels under `ketch:` and `{ketch:`, every
//! command. Two gateways on it create, append, wake each other's fetches,
//! commit a group's offsets, start a transactional producer and delete a
//! topic (whose deletion record is under `{ketch:topics}`).

use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, assert_fetch_wakes_across, unique_topic};

#[test]
fn a_redis_user_limited_to_the_namespace_runs_two_gateways() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("ketch")
        .arg("on")
        .arg(">s3cret")
        .arg("resetkeys")
        .arg("resetchannels")
        .arg("~ketch:*")
        .arg("~{ketch:*")
        .arg("&ketch:*")
        .arg("&{ketch:*")
        .arg("+@all")
        .query(&mut redis.connection())
        .expect("ACL SETUSER");
    let url = format!("redis://ketch:s3cret@127.0.0.1:{}", redis.port());
    let a = Ketch::start(&url, &["--node-id", "1"]);
    let b = Ketch::start(&url, &["--node-id", "2"]);
    assert_fetch_wakes_across(&a, &b, 2);
    let mut conn = KafkaConn::connect(a.kafka_addr());
    let topic = unique_topic("acl");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let commit: kafka_protocol::messages::OffsetCommitResponse = conn.request(
        8,
        &raw::offset_commit_request(&unique_topic("acl-group"), "", -1, &topic, 0, 1),
    );
    assert_eq!(commit.topics[0].partitions[0].error_code, code::NONE);
    let init: kafka_protocol::messages::InitProducerIdResponse = conn.request(
        4,
        &kafka_protocol::messages::InitProducerIdRequest::default()
            .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(
                kafka_protocol::protocol::StrBytes::from_string(unique_topic("acl-txn")),
            )))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1),
    );
    assert_eq!(init.error_code, code::NONE);
    assert_eq!(raw::delete_topic(&mut conn, &topic), code::NONE);
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.connection())
        .unwrap();
    assert!(
        clients.lines().filter(|l| l.contains(" user=ketch ")).count() >= 4,
        "the gateways connect as the limited user:\n{clients}"
    );
    // Nothing of ketch's is outside the namespace.
    let outside: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query::<Vec<String>>(&mut redis.connection())
        .unwrap()
        .into_iter()
        .filter(|k| !k.starts_with("ketch:") && !k.starts_with("{ketch:"))
        .collect();
    assert_eq!(outside, Vec::<String>::new());
}

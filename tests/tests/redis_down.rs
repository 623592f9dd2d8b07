//! Redis unreachable at start: ketch still starts, says it is not ready,
//! answers Kafka requests with retriable errors, and serves normally once
//! Redis appears — without a restart.

use std::thread;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kafka_protocol::messages::MetadataRequest;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, runtime, unique_topic};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;

#[test]
fn ketch_started_before_redis_serves_once_redis_is_up() {
    let mut redis = RedisServer::reserve();
    let ketch = Ketch::start(&redis.url(), &[]);

    assert_eq!(ketch.http_get("/health").0, 200, "/health while Redis is down");
    assert_eq!(ketch.http_get("/ready").0, 503, "/ready while Redis is down");
    let (status, body) = ketch.http_get("/api/v1/topics");
    assert_eq!(status, 503, "the topic listing while Redis is down: {body}");
    assert!(body.contains("STORAGE_ERROR"), "{body}");
    let (status, body) = ketch.http_get("/api/v1/redis");
    assert_eq!(status, 503, "Redis's memory while Redis is down: {body}");
    let health: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(health["error"].is_string(), "{body}");

    let topic = unique_topic("late-redis");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let metadata = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(raw::topic_name(&topic))),
        ]))
        .with_allow_auto_topic_creation(true);
    let asked = Instant::now();
    let response = conn.request(9, &metadata);
    let metadata_error = response.topics[0].error_code;
    assert!(
        code::RETRIABLE.contains(&metadata_error),
        "Metadata while Redis is down: error {metadata_error} is not retriable (after {:?})",
        asked.elapsed()
    );
    let asked = Instant::now();
    let (produce_error, _) = raw::produce(
        &mut conn,
        &topic,
        0,
        batch::encode(&[Record::value(batch::at(1), b"early")]),
    );
    assert!(
        code::RETRIABLE.contains(&produce_error),
        "Produce while Redis is down: error {produce_error} is not retriable (after {:?})",
        asked.elapsed()
    );

    // A fetch: KAFKA_STORAGE_ERROR from v6 on, NOT_LEADER_OR_FOLLOWER
    // before, as Kafka answers (older clients take 56 as fatal).
    for (version, want) in [(5, 6), (12, 56)] {
        let response = conn.request(version, &raw::fetch_request(&topic, 0, 0, 0));
        assert_eq!(
            response.responses[0].partitions[0].error_code, want,
            "Fetch v{version} while Redis is down"
        );
    }

    // The gateway has no node id yet (it claims one in Redis): it names no
    // coordinator, with the error clients retry.
    let coordinator = conn.request(
        3,
        &kafka_protocol::messages::FindCoordinatorRequest::default()
            .with_key(kafka_protocol::protocol::StrBytes::from_static_str("g")),
    );
    assert_eq!(
        coordinator.error_code, 15,
        "COORDINATOR_NOT_AVAILABLE while Redis is down"
    );
    // So does one with a configured node id, which it knows: until it has
    // registered, it is not the whole cluster either.
    let configured = Ketch::start_node(&redis.url(), 5, "5s", &[]);
    let mut configured_conn = KafkaConn::connect(configured.kafka_addr());
    let coordinator = configured_conn.request(
        3,
        &kafka_protocol::messages::FindCoordinatorRequest::default()
            .with_key(kafka_protocol::protocol::StrBytes::from_static_str("g")),
    );
    assert_eq!(
        (coordinator.error_code, coordinator.node_id.0),
        (15, -1),
        "a configured id names no coordinator before it registers"
    );
    let brokers = configured_conn.request(12, &MetadataRequest::default().with_topics(Some(Vec::new())));
    assert!(
        brokers.brokers.is_empty(),
        "Metadata lists {:?} before the gateway registered",
        brokers.brokers
    );
    drop(configured);

    // The transaction listings: errors the admin client retries
    // (kafka-transactions.sh through a Redis failover), not
    // KAFKA_STORAGE_ERROR, which fails them.
    let described = conn.request(
        0,
        &kafka_protocol::messages::DescribeTransactionsRequest::default().with_transactional_ids(vec![
            kafka_protocol::messages::TransactionalId(kafka_protocol::protocol::StrBytes::from_static_str(
                "t",
            )),
        ]),
    );
    assert_eq!(
        described.transaction_states[0].error_code, 15,
        "DescribeTransactions"
    );
    let listed = conn.request(0, &kafka_protocol::messages::ListTransactionsRequest::default());
    assert_eq!(
        listed.error_code, 14,
        "ListTransactions: COORDINATOR_LOAD_IN_PROGRESS"
    );
    // A group's committed offsets: NOT_COORDINATOR, as Kafka's
    // coordinator answers a read that failed (KAFKA-17267): the Java
    // consumer before 3.9 fails its poll() on COORDINATOR_NOT_AVAILABLE.
    // v1 has no group error: it is each partition's.
    {
        use kafka_protocol::messages::offset_fetch_request::{
            OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
        };
        use kafka_protocol::messages::{GroupId, OffsetFetchRequest};
        let group = || GroupId(kafka_protocol::protocol::StrBytes::from_static_str("g"));
        let old = OffsetFetchRequest::default()
            .with_group_id(group())
            .with_topics(Some(vec![
                OffsetFetchRequestTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partition_indexes(vec![0, 1]),
            ]));
        let fetched = conn.request(5, &old);
        assert_eq!(fetched.error_code, 16, "OffsetFetch v5");
        let fetched = conn.request(1, &old);
        let errors: Vec<i16> = fetched.topics[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .collect();
        assert_eq!(errors, [16, 16], "OffsetFetch v1, on each partition");
        let new = OffsetFetchRequest::default().with_groups(vec![
            OffsetFetchRequestGroup::default()
                .with_group_id(group())
                .with_topics(Some(vec![
                    OffsetFetchRequestTopics::default()
                        .with_name(raw::topic_name(&topic))
                        .with_partition_indexes(vec![0]),
                ])),
        ]);
        assert_eq!(conn.request(8, &new).groups[0].error_code, 16, "OffsetFetch v8");
    }
    // An idempotent producer's id: COORDINATOR_LOAD_IN_PROGRESS, as Kafka's
    // id manager answers, which the client retries as it is;
    // COORDINATOR_NOT_AVAILABLE sends the Java producer to look up a
    // transaction coordinator for a transactional id it does not have.
    let idempotent = conn.request(
        4,
        &kafka_protocol::messages::InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1),
    );
    assert_eq!(idempotent.error_code, 14, "idempotent InitProducerId");

    // A listing of every topic has no list to answer with: the connection
    // closes (an empty list would tell clients every topic is gone).
    let mut listing = KafkaConn::connect(ketch.kafka_addr());
    listing.send(12, &MetadataRequest::default().with_topics(None));
    listing.assert_closed();

    eprintln!("while Redis is down: Metadata error {metadata_error}, Produce error {produce_error}");

    redis.start_again();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = ketch.http_get("/ready");
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/ready still {status} {body:?} 30 s after Redis started"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = ketch.http_get("/api/v1/redis");
    assert_eq!(status, 200, "Redis's memory once Redis is up: {body}");
    assert!(body.contains("\"error\":null"), "{body}");

    // The gateway recorded the layout of a new namespace before it
    // registered: its own registry entry is not mistaken for old data.
    let layout: Option<String> = redis::cmd("HGET")
        .arg("ketch:layout")
        .arg("version")
        .query(&mut redis.connection())
        .expect("HGET ketch:layout");
    assert!(layout.is_some(), "layout version recorded");
    assert!(
        !ketch.output().contains("migrated the Redis layout"),
        "a new namespace is recorded, not migrated:\n{}",
        ketch.output()
    );

    // The connection opened while Redis was down works now.
    let (error, offset) = raw::produce(
        &mut conn,
        &topic,
        0,
        batch::encode(&[Record::value(batch::at(1), b"first")]),
    );
    assert_eq!((error, offset), (code::NONE, 0));
    // A topic record this release cannot read is left out of a listing,
    // which lists the others.
    let _: () = redis::cmd("HSET")
        .arg("ketch:topics")
        .arg("unreadable")
        .arg("{not a topic")
        .query(&mut redis.connection())
        .unwrap();
    let all: kafka_protocol::messages::MetadataResponse =
        conn.request(12, &MetadataRequest::default().with_topics(None));
    let names: Vec<String> = all
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .collect();
    assert_eq!(names, std::slice::from_ref(&topic));
    let _: () = redis::cmd("HDEL")
        .arg("ketch:topics")
        .arg("unreadable")
        .query(&mut redis.connection())
        .unwrap();

    // And so does a real client.
    let rt = runtime();
    let producer = ketch.producer();
    let values: Vec<String> = (1..=10).map(|i| format!("after redis came up {i}")).collect();
    let deliveries: Vec<_> = values
        .iter()
        .map(|v| {
            let record: FutureRecord<'_, (), String> = FutureRecord::to(&topic).partition(0).payload(v);
            producer.send_result(record).map_err(|(e, _)| e).expect("enqueue")
        })
        .collect();
    for result in rt.block_on(join_all(deliveries)) {
        result
            .expect("delivery future")
            .map_err(|(e, _)| e)
            .expect("delivered");
    }

    let consumer = ketch.consumer_at(&topic, &[0], 0);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 1 + values.len() {
        assert!(Instant::now() < deadline, "consumed only {got:?}");
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            let message = message.expect("consume");
            got.push(String::from_utf8(message.payload().expect("value").to_vec()).expect("utf-8"));
        }
    }
    assert_eq!(got[0], "first");
    assert_eq!(got[1..], values[..]);
}

/// With ACLs on, a gateway that has not read them yet (Redis down since it
/// started) serves no request: it closes the connection, which clients
/// retry, where an authorization error would be fatal to them (Kafka's
/// listeners wait for the authorizer's first load). Once Redis is up, the
/// same requests are served.
#[test]
fn a_gateway_that_has_not_read_the_acls_serves_nothing() {
    let mut redis = RedisServer::reserve();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "acl.enabled=true",
            "--set",
            "acl.allow_everyone_if_no_acl_found=true",
        ],
    );
    let topic = unique_topic("acl-unread");
    let metadata = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(raw::topic_name(&topic))),
        ]))
        .with_allow_auto_topic_creation(true);
    // ApiVersions is served (clients send it first, and it needs no ACL).
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let versions = conn.request(2, &kafka_protocol::messages::ApiVersionsRequest::default());
    assert_eq!(versions.error_code, 0);
    conn.send(9, &metadata);
    conn.assert_closed();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    conn.send(12, &MetadataRequest::default().with_topics(None));
    conn.assert_closed();

    redis.start_again();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        conn.send(9, &metadata);
        // Answered, or closed.
        if conn.read_frame().is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "requests still refused 30 s after Redis started"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (error, offset) = raw::produce(
        &mut conn,
        &topic,
        0,
        batch::encode(&[Record::value(batch::at(1), b"after")]),
    );
    assert_eq!((error, offset), (code::NONE, 0));
}

//! With `topics.auto_create=false`, an unknown topic stays unknown; and a
//! fetch beyond the end of a log is OFFSET_OUT_OF_RANGE, as Kafka answers.

use kafka_protocol::messages::MetadataRequest;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, unique_topic};

fn start() -> (RedisServer, Ketch) {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    (redis, ketch)
}

#[test]
fn produce_to_an_unknown_topic_is_unknown_topic_or_partition() {
    let (redis, ketch) = start();
    let topic = unique_topic("unknown");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let batch = batch::encode(&[Record::value(batch::at(1), b"lost")]);
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch).0,
        code::UNKNOWN_TOPIC_OR_PARTITION
    );

    let exists: bool = redis::cmd("HEXISTS")
        .arg("ketch:topics")
        .arg(&topic)
        .query(&mut redis.connection())
        .expect("HEXISTS");
    assert!(!exists, "the produce created the topic");
}

#[test]
fn metadata_for_an_unknown_topic_does_not_create_it() {
    let (_redis, ketch) = start();
    let topic = unique_topic("unknown");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let request = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(raw::topic_name(&topic))),
        ]))
        .with_allow_auto_topic_creation(true);
    for _ in 0..2 {
        let response = conn.request(9, &request);
        assert_eq!(response.topics[0].error_code, code::UNKNOWN_TOPIC_OR_PARTITION);
    }
}

#[test]
fn produce_to_a_partition_the_topic_lacks_is_unknown_topic_or_partition() {
    let (_redis, ketch) = start();
    let topic = unique_topic("two-partitions");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let batch = batch::encode(&[Record::value(batch::at(1), b"x")]);
    assert_eq!(
        raw::produce(&mut conn, &topic, 2, batch).0,
        code::UNKNOWN_TOPIC_OR_PARTITION
    );
}

#[test]
fn fetch_past_the_end_is_offset_out_of_range() {
    let (_redis, ketch) = start();
    let topic = unique_topic("short");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let records: Vec<Record> = (0..5).map(|i| Record::value(batch::at(i), b"r")).collect();
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch::encode(&records)),
        (code::NONE, 0)
    );

    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 5 + 10, 100));
    assert_eq!(raw::fetch_result(&response).0, code::OFFSET_OUT_OF_RANGE);

    // At the end itself is not out of range: an empty answer after max_wait.
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 5, 100));
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 5));
    assert_eq!(records.as_deref().map_or(0, raw::count_records), 0);
}

/// As Kafka: a name equal to an existing topic's once '.' and '_' are
/// taken for the same character is refused (INVALID_TOPIC_EXCEPTION), by
/// CreateTopics and by auto-creation, and nothing is created.
#[test]
fn a_name_colliding_with_a_topic_through_dot_and_underscore_is_refused() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let base = unique_topic("collide");
    let (underscore, dot) = (format!("{base}_x"), format!("{base}.x"));
    assert_eq!(raw::create_topic(&mut conn, &underscore, 1), code::NONE);
    for validate_only in [true, false] {
        let request = raw::create_topic_request(&dot, 1).with_validate_only(validate_only);
        let response = conn.request(5, &request);
        let created = &response.topics[0];
        assert_eq!(
            created.error_code, 17,
            "INVALID_TOPIC_EXCEPTION (validate_only {validate_only})"
        );
        let message = created.error_message.as_deref().unwrap_or_default().to_owned();
        assert!(message.contains(&underscore), "{message}");
    }
    // Auto-creation (Metadata) refuses it too.
    let metadata = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(raw::topic_name(&dot))),
        ]))
        .with_allow_auto_topic_creation(true);
    let response: kafka_protocol::messages::MetadataResponse = conn.request(9, &metadata);
    assert_eq!(response.topics[0].error_code, 17);
    let exists: bool = redis::cmd("HEXISTS")
        .arg("ketch:topics")
        .arg(&dot)
        .query(&mut redis.connection())
        .unwrap();
    assert!(!exists, "nothing created");
}

/// `__cluster_metadata` is KRaft's metadata log, which Kafka never lets a
/// client create: CreateTopics is INVALID_REQUEST with Kafka's message
/// (validate_only too), auto-creation leaves it unknown, and nothing is
/// created.
#[test]
fn the_cluster_metadata_topic_cannot_be_created() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for validate_only in [true, false] {
        let request = raw::create_topic_request("__cluster_metadata", 1).with_validate_only(validate_only);
        let response = conn.request(5, &request);
        let refused = &response.topics[0];
        assert_eq!(
            refused.error_code,
            code::INVALID_REQUEST,
            "validate_only {validate_only}"
        );
        assert_eq!(
            refused.error_message.as_deref(),
            Some("Creation of internal topic __cluster_metadata is prohibited.")
        );
    }
    let metadata = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(raw::topic_name("__cluster_metadata"))),
        ]))
        .with_allow_auto_topic_creation(true);
    let response: kafka_protocol::messages::MetadataResponse = conn.request(9, &metadata);
    assert_eq!(response.topics[0].error_code, code::UNKNOWN_TOPIC_OR_PARTITION);
    let exists: bool = redis::cmd("HEXISTS")
        .arg("ketch:topics")
        .arg("__cluster_metadata")
        .query(&mut redis.connection())
        .unwrap();
    assert!(!exists, "nothing created");
}

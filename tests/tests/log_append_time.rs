//! `message.timestamp.type=LogAppendTime` (issue #6, part): the gateway
//! stamps each batch with its clock, recomputes the CRC, and clients see the
//! append time instead of the producer's timestamps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, runtime, unique_topic};
use rdkafka::Message;
use rdkafka::message::Timestamp;

#[test]
fn consumers_see_the_append_time() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("log-append-time");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());

    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let request = raw::produce_request(
        &topic,
        0,
        batch::encode(&[
            Record::value(batch::at(1_000), b"a"),
            Record::value(batch::at(2_000), b"b"),
        ]),
    );
    let response = conn.request(raw::PRODUCE_VERSION, &request);
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, code::NONE);
    let append_time = partition.log_append_time_ms;
    assert!(
        append_time >= before && append_time < before + 60_000,
        "append time {append_time}"
    );

    let consumer = ketch.consumer_at(&topic, &[0], 0);
    for expected_offset in 0..2 {
        let message = consumer
            .poll(Duration::from_secs(30))
            .expect("a record within 30 s")
            .expect("consume");
        assert_eq!(message.offset(), expected_offset);
        assert_eq!(message.timestamp(), Timestamp::LogAppendTime(append_time));
    }
    // CreateTime topics keep the producer's timestamps.
    let plain = unique_topic("create-time");
    assert_eq!(raw::create_topic(&mut conn, &plain, 1), code::NONE);
    let response = conn.request(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&plain, 0, batch::encode(&[Record::value(batch::at(1_000), b"a")])),
    );
    assert_eq!(
        response.responses[0].partition_responses[0].log_append_time_ms,
        -1
    );
}

/// A retried idempotent batch is answered with the time it was stored at,
/// the time its consumers see, as Kafka answers a duplicate.
#[test]
fn a_retried_batch_is_answered_with_its_stored_append_time() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("log-append-time-retry");
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let init = kafka_protocol::messages::InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_producer_id(kafka_protocol::messages::ProducerId(-1))
        .with_producer_epoch(-1);
    let producer_id = conn.request(4, &init).producer_id.0;
    let batch = batch::encode_idempotent(&[Record::value(batch::at(1_000), b"once")], producer_id, 0, 0);
    let append_time = |conn: &mut KafkaConn| {
        let response = conn.request(
            raw::PRODUCE_VERSION,
            &raw::produce_request(&topic, 0, batch.clone()),
        );
        let partition = &response.responses[0].partition_responses[0];
        assert_eq!((partition.error_code, partition.base_offset), (code::NONE, 0));
        partition.log_append_time_ms
    };
    let first = append_time(&mut conn);
    // The clock moves on before the retry (an event to wait for: the next
    // millisecond).
    while SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64 <= first + 5 {
        std::thread::yield_now();
    }
    assert_eq!(append_time(&mut conn), first, "the retry's answer");
    assert_eq!(redis.next_offset(&topic, 0), 1, "stored once");
}

/// A producer's batch that says LogAppendTime, sent to a CreateTime
/// topic: Kafka reads each of its records at the batch's max timestamp and
/// checks that against the topic's bounds (an unchecked far-future time
/// would hold retention back), then stores the batch as CreateTime with
/// that max timestamp. So does ketch.
#[test]
fn a_producers_log_append_time_batch_on_a_create_time_topic_is_checked_and_stored_as_create_time() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("create-time-lat-batch");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let stamped = |max_timestamp: i64| {
        let mut bad = batch::encode(&[
            Record::value(batch::at(1_000), b"a"),
            Record::value(batch::at(2_000), b"b"),
        ]);
        bad[batch::ATTRIBUTES_AT + 1] |= 0x08;
        bad[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
        batch::fix_crc(&mut bad);
        bad
    };
    let future = now + 10 * 24 * 3600 * 1000;
    let response = conn.request(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&topic, 0, stamped(future)),
    );
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, code::INVALID_TIMESTAMP);
    let indexes: Vec<i32> = partition.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(indexes, [0, 1], "every record is at the batch's max timestamp");
    assert_eq!(redis.stream_len(&topic, 0), 0, "nothing stored");

    let response = conn.request(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&topic, 0, stamped(now)),
    );
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!((partition.error_code, partition.base_offset), (code::NONE, 0));
    assert_eq!(partition.log_append_time_ms, -1);
    let fetched = conn.request(12, &raw::fetch_request(&topic, 0, 0, 0));
    let (error, _, records) = raw::fetch_result(&fetched);
    assert_eq!(error, code::NONE);
    let stored = records.expect("the stored batch");
    assert_eq!(stored[batch::ATTRIBUTES_AT + 1] & 0x08, 0, "stored as CreateTime");
    assert_eq!(i64::from_be_bytes(stored[35..43].try_into().unwrap()), now);
    assert_eq!(
        batch::crc32c(&stored[batch::ATTRIBUTES_AT..]).to_be_bytes(),
        stored[batch::CRC_AT..batch::CRC_AT + 4]
    );
}

/// A batch with a timestamp far in the past (a producer's LogAppendTime
/// batch of max timestamp -1e15 on a CreateTime topic, which the default
/// `message.timestamp.before.max.ms` lets through) that opens a segment:
/// Redis writes the sealed segment's timestamps past 14 digits as floats,
/// which every read of the partition's segments refused for good
/// (archiving, compaction, ListOffsets -5, the admin API).
#[test]
fn a_segment_of_a_far_off_timestamp_is_read() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "tiering.tick_interval=100ms"]);
    let topic = unique_topic("far-off-timestamp");
    ketch.create_topic_with(&runtime(), &topic, 1, &[("segment.bytes", "14")]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut far = batch::encode(&[Record::value(batch::at(1_000), b"far")]);
    far[batch::ATTRIBUTES_AT + 1] |= 0x08;
    far[35..43].copy_from_slice(&(-1_000_000_000_000_000i64).to_be_bytes());
    batch::fix_crc(&mut far);
    assert_eq!(raw::produce(&mut conn, &topic, 0, far).0, code::NONE);
    let next = batch::encode(&[Record::value(batch::at(2_000), b"next")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, next), (code::NONE, 1));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while redis.segments(&topic, 0).is_empty() {
        assert!(std::time::Instant::now() < deadline, "never sealed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = ketch.http_get(&format!("/api/v1/topics/{topic}"));
    assert_eq!(status, 200, "{body}");
    let described: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        described["partitions"][0]["segments_sealed"].as_i64() >= Some(1),
        "{body}"
    );
}

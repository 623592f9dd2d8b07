//! ListOffsets gives Kafka's answers: by timestamp T, the earliest offset
//! whose record timestamp is ≥ T (end of log when there is none), whether
//! timestamps rise or not and however records are grouped into batches;
//! earliest and latest as the watermarks.

use std::time::Duration;

use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

/// The time the records' timestamps count from: recent, so that no
/// retention deletes them.
fn b() -> i64 {
    batch::at(0)
}
/// Record timestamps by offset, after `b()`; not monotonic, with a repeated
/// value.
const TIMESTAMPS: [i64; 7] = [1000, 2000, 1500, 3000, 3000, 2500, 4000];
/// How each partition groups the records into batches.
const LAYOUTS: [&[usize]; 3] = [&[1, 1, 1, 1, 1, 1, 1], &[7], &[3, 3, 1]];

fn kafka_answer(t: i64) -> Offset {
    TIMESTAMPS
        .iter()
        .position(|&ts| b() + ts >= t)
        .map_or(Offset::End, |o| Offset::Offset(o as i64))
}

#[test]
fn offsets_for_times_finds_the_first_record_at_or_after_t() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("times");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        raw::create_topic(&mut conn, &topic, LAYOUTS.len() as i32),
        code::NONE
    );

    for (partition, layout) in LAYOUTS.iter().enumerate() {
        let mut offset = 0;
        for &size in *layout {
            let records: Vec<Record> = (offset..offset + size)
                .map(|o| Record::value(b() + TIMESTAMPS[o], format!("record {o}").as_bytes()))
                .collect();
            let (error, base) = raw::produce(&mut conn, &topic, partition as i32, batch::encode(&records));
            assert_eq!(
                (error, base),
                (code::NONE, offset as i64),
                "partition {partition}"
            );
            offset += size;
        }
    }

    let consumer = ketch.consumer();
    let queries = [
        b() - 1_000_000, // before the log
        b() + 1000,      // equal to the first record's
        b() + 1200,      // between two timestamps
        b() + 1500,      // equal to a record that follows a later one
        b() + 2000,
        b() + 2200,
        b() + 2500,
        b() + 3000, // equal to two records
        b() + 3500,
        b() + 4000, // equal to the last
        b() + 4001, // after the log
    ];
    for t in queries {
        let mut request = TopicPartitionList::new();
        for partition in 0..LAYOUTS.len() as i32 {
            request
                .add_partition_offset(&topic, partition, Offset::Offset(t))
                .expect("partition");
        }
        let answer = consumer
            .offsets_for_times(request, Duration::from_secs(10))
            .expect("offsets_for_times");
        for partition in 0..LAYOUTS.len() as i32 {
            let got = answer
                .find_partition(&topic, partition)
                .expect("partition in answer");
            got.error().expect("no partition error");
            assert_eq!(
                got.offset(),
                kafka_answer(t),
                "T = B+{} on partition {partition} (batches {:?})",
                t - b(),
                LAYOUTS[partition as usize]
            );
        }
    }

    for partition in 0..LAYOUTS.len() as i32 {
        let watermarks = consumer
            .fetch_watermarks(&topic, partition, Duration::from_secs(10))
            .expect("watermarks");
        assert_eq!(watermarks, (0, TIMESTAMPS.len() as i64), "partition {partition}");
    }
}

#[test]
fn list_offsets_special_timestamps() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("special");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let records: Vec<Record> = TIMESTAMPS
        .iter()
        .map(|&ts| Record::value(b() + ts, b"v"))
        .collect();
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch::encode(&records[..4])).0,
        code::NONE
    );
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch::encode(&records[4..])).0,
        code::NONE
    );

    let list = |conn: &mut KafkaConn, timestamp: i64| raw::list_offsets(conn, &topic, 0, timestamp);
    assert_eq!(list(&mut conn, -2).0, code::NONE);
    assert_eq!(list(&mut conn, -2).1, 0, "earliest");
    assert_eq!(list(&mut conn, -1).1, TIMESTAMPS.len() as i64, "latest");
    assert_eq!(list(&mut conn, -3), (code::NONE, 6, b() + 4000), "max timestamp");
    assert_eq!(
        list(&mut conn, b() + 2200),
        (code::NONE, 3, b() + 3000),
        "by timestamp"
    );
    assert_eq!(list(&mut conn, b() + 9999).1, -1, "after the log");

    // A negative timestamp a version does not know: UNSUPPORTED_VERSION,
    // as from Kafka (-3 from v7, -4 from v8, -5 from v9, others never here).
    let at = |conn: &mut KafkaConn, version: i16, timestamp: i64| {
        let request = raw::list_offsets_request(&topic, 0, timestamp);
        raw::list_offsets_result(&conn.request(version, &request)).0
    };
    const UNSUPPORTED_VERSION: i16 = 35;
    assert_eq!(at(&mut conn, 6, -3), UNSUPPORTED_VERSION);
    assert_eq!(at(&mut conn, 7, -3), code::NONE);
    assert_eq!(at(&mut conn, 7, -4), UNSUPPORTED_VERSION);
    assert_eq!(at(&mut conn, 8, -4), code::NONE);
    assert_eq!(at(&mut conn, 8, -5), UNSUPPORTED_VERSION);
    for unknown in [-6, -100] {
        assert_eq!(at(&mut conn, 9, unknown), UNSUPPORTED_VERSION, "{unknown}");
    }
    // -5 (v9): the last archived offset; this topic has no archive, so -1
    // with no leader epoch, as Kafka answers without a remote log.
    let tiered = conn.request(9, &raw::list_offsets_request(&topic, 0, -5));
    let p = &tiered.topics[0].partitions[0];
    assert_eq!((p.error_code, p.offset, p.leader_epoch), (code::NONE, -1, -1));
    assert_eq!(at(&mut conn, 1, -2), code::NONE);

    // A partition named twice: INVALID_REQUEST for each, as from Kafka.
    let mut twice = raw::list_offsets_request(&topic, 0, -1);
    let again = twice.topics[0].partitions[0].clone();
    twice.topics[0].partitions.push(again);
    let response = conn.request(8, &twice);
    let answers: Vec<(i16, i64)> = response.topics[0]
        .partitions
        .iter()
        .map(|p| (p.error_code, p.offset))
        .collect();
    const INVALID_REQUEST: i16 = 42;
    assert_eq!(answers, [(INVALID_REQUEST, -1), (INVALID_REQUEST, -1)]);
    // Twice, with a timestamp its version does not know: the duplicate is
    // told first, as Kafka checks it first; so is an unknown topic after
    // the timestamp's version.
    let mut twice = raw::list_offsets_request(&topic, 0, -3);
    let again = twice.topics[0].partitions[0].clone();
    twice.topics[0].partitions.push(again);
    let response = conn.request(6, &twice);
    assert_eq!(response.topics[0].partitions[0].error_code, INVALID_REQUEST);
    let missing = raw::list_offsets_request(&unique_topic("missing"), 0, -3);
    let response = conn.request(6, &missing);
    assert_eq!(response.topics[0].partitions[0].error_code, UNSUPPORTED_VERSION);
}

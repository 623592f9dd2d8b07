//! A real Kafka client (rdkafka) produces through ketch and consumes back:
//! every record byte-identical, offsets dense from 0 in every partition.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ketch_tests::{Ketch, TestRedis, runtime, unique_topic};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

const RECORDS: usize = 100_000;
const PARTITIONS: i32 = 8;
/// Where the records' timestamps start: recent, so that no retention
/// deletes them.
fn base_timestamp() -> i64 {
    ketch_tests::batch::at(0)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    partition: i32,
    timestamp: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Record `i`: every shape a client may send — null key, null value, no
/// headers, a repeated header key, a header with a null value.
fn record(i: usize, rng: &mut StdRng) -> Expected {
    let key = (!i.is_multiple_of(10)).then(|| format!("key-{i}").into_bytes());
    let value = (!i.is_multiple_of(13)).then(|| {
        let len = rng.random_range(0..200);
        (0..len).map(|_| rng.random()).collect()
    });
    let headers = match i % 4 {
        0 => Vec::new(),
        1 => vec![("trace".to_owned(), Some(i.to_string().into_bytes()))],
        2 => vec![
            ("dup".to_owned(), Some(b"first".to_vec())),
            ("other".to_owned(), Some(Vec::new())),
            ("dup".to_owned(), Some(b"second".to_vec())),
        ],
        _ => vec![
            ("null-value".to_owned(), None),
            ("dup".to_owned(), Some(vec![0, 255])),
        ],
    };
    Expected {
        partition: (i % PARTITIONS as usize) as i32,
        // Not monotonic within a partition: clients may send any timestamp.
        timestamp: base_timestamp() + (i as i64 * 7919) % 100_003,
        key,
        value,
        headers,
    }
}

#[test]
fn hundred_thousand_records_round_trip_byte_identical() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let rt = runtime();
    let topic = unique_topic("roundtrip");
    ketch.create_topic(&rt, &topic, PARTITIONS);

    let mut rng = StdRng::seed_from_u64(2);
    let expected: Vec<Expected> = (0..RECORDS).map(|i| record(i, &mut rng)).collect();

    // Produce everything, then learn each record's (partition, offset).
    let producer = ketch.producer();
    let started = Instant::now();
    let deliveries = expected
        .iter()
        .map(|r| {
            let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
            for (key, value) in &r.headers {
                headers = headers.insert(Header {
                    key: key.as_str(),
                    value: value.as_ref(),
                });
            }
            let mut record: FutureRecord<'_, Vec<u8>, Vec<u8>> = FutureRecord::to(&topic)
                .partition(r.partition)
                .timestamp(r.timestamp)
                .headers(headers);
            if let Some(key) = &r.key {
                record = record.key(key);
            }
            if let Some(value) = &r.value {
                record = record.payload(value);
            }
            producer.send_result(record).map_err(|(e, _)| e).expect("enqueue")
        })
        .collect::<Vec<_>>();
    let results = rt.block_on(join_all(deliveries));
    let mut at: HashMap<(i32, i64), usize> = HashMap::with_capacity(RECORDS);
    for (i, result) in results.into_iter().enumerate() {
        let delivery = result
            .expect("delivery future")
            .map_err(|(e, _)| e)
            .expect("delivered");
        assert_eq!(delivery.partition, expected[i].partition);
        assert!(
            at.insert((delivery.partition, delivery.offset), i).is_none(),
            "offset acked twice"
        );
    }
    eprintln!("produced {RECORDS} records in {:?}", started.elapsed());

    let consumer = ketch.consumer();
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset(&topic, p, Offset::Offset(0))
            .expect("assign");
    }
    consumer.assign(&assignment).expect("assign");
    let consumed = consume_and_check(&consumer, &expected, &at);
    assert_eq!(consumed, RECORDS);
    eprintln!("produced and consumed in {:?}", started.elapsed());

    for p in 0..PARTITIONS {
        let (low, high) = consumer
            .fetch_watermarks(&topic, p, Duration::from_secs(10))
            .expect("watermarks");
        let count = expected.iter().filter(|r| r.partition == p).count() as i64;
        assert_eq!((low, high), (0, count), "watermarks of partition {p}");
    }
}

/// Reads until every record came back, checking offsets are dense from 0 and
/// each record is the one acknowledged at that offset.
fn consume_and_check(
    consumer: &BaseConsumer,
    expected: &[Expected],
    at: &HashMap<(i32, i64), usize>,
) -> usize {
    let mut next_offset = [0i64; PARTITIONS as usize];
    let mut consumed = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while consumed < expected.len() {
        assert!(Instant::now() < deadline, "consumed only {consumed} records");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("consume");
        let p = message.partition();
        let offset = message.offset();
        assert_eq!(offset, next_offset[p as usize], "offsets dense in partition {p}");
        next_offset[p as usize] += 1;
        let index = *at
            .get(&(p, offset))
            .unwrap_or_else(|| panic!("partition {p} offset {offset} was never acknowledged"));
        let want = &expected[index];
        let headers: Vec<(String, Option<Vec<u8>>)> = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let got = Expected {
            partition: p,
            timestamp: message.timestamp().to_millis().expect("timestamp"),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
        };
        assert_eq!(&got, want, "record {index} at partition {p} offset {offset}");
        consumed += 1;
    }
    consumed
}

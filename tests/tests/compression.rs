//! Every compression codec a Kafka client may use round-trips through ketch
//! (batches are stored as the client compressed them).

use std::time::{Duration, Instant};

use futures::future::join_all;
use ketch_tests::{Ketch, TestRedis, runtime, unique_topic};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;

const RECORDS: usize = 3_000;

fn value(i: usize) -> Vec<u8> {
    // Compressible, and different per record.
    format!("value {i} {}", "abcdefgh".repeat(i % 20)).into_bytes()
}

fn round_trip(codec: &str) {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let rt = runtime();
    let topic = unique_topic(&format!("compression-{codec}"));
    ketch.create_topic(&rt, &topic, 1);

    let producer = ketch.producer_with(&[("compression.type", codec)]);
    let keys: Vec<String> = (0..RECORDS).map(|i| format!("k{i}")).collect();
    let values: Vec<Vec<u8>> = (0..RECORDS).map(value).collect();
    let deliveries = (0..RECORDS).map(|i| {
        let record = FutureRecord::to(&topic)
            .partition(0)
            .key(&keys[i])
            .payload(&values[i])
            .timestamp(1_000 + i as i64);
        producer.send_result(record).map_err(|(e, _)| e).expect("enqueue")
    });
    // Which record each offset holds (ordering is produce_fetch.rs's concern).
    let mut at = vec![usize::MAX; RECORDS];
    let results = rt.block_on(join_all(deliveries.collect::<Vec<_>>()));
    for (i, result) in results.into_iter().enumerate() {
        let delivery = result
            .expect("delivery future")
            .map_err(|(e, _)| e)
            .expect("delivered");
        let offset = usize::try_from(delivery.offset).expect("offset");
        assert!(
            offset < RECORDS && at[offset] == usize::MAX,
            "{codec}: offset {offset} acked for record {i}"
        );
        at[offset] = i;
    }

    let consumer = ketch.consumer_at(&topic, &[0], 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 0usize;
    while next < RECORDS {
        assert!(Instant::now() < deadline, "{codec}: consumed only {next} records");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("consume");
        assert_eq!(message.offset(), next as i64, "{codec}: offset");
        let i = at[next];
        assert_eq!(message.key(), Some(keys[i].as_bytes()), "{codec}: key at {next}");
        assert_eq!(
            message.payload(),
            Some(values[i].as_slice()),
            "{codec}: value at {next}"
        );
        assert_eq!(message.timestamp().to_millis(), Some(1_000 + i as i64));
        next += 1;
    }
}

#[test]
fn uncompressed_batches_round_trip() {
    round_trip("none");
}

#[test]
fn gzip_batches_round_trip() {
    round_trip("gzip");
}

#[test]
fn snappy_batches_round_trip() {
    round_trip("snappy");
}

#[test]
fn lz4_batches_round_trip() {
    round_trip("lz4");
}

#[test]
fn zstd_batches_round_trip() {
    round_trip("zstd");
}

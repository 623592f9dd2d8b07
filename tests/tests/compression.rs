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
            .timestamp(ketch_tests::batch::at(1_000 + i as i64));
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
        assert_eq!(
            message.timestamp().to_millis(),
            Some(ketch_tests::batch::at(1_000 + i as i64))
        );
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

/// A topic's `compression.type` other than `producer`: every batch in
/// another codec is stored compressed with the topic's (records, offsets,
/// timestamps, headers unchanged), one already in it byte for byte as it
/// came; rdkafka reads them all.
#[test]
fn a_topics_compression_type_recompresses_batches_in_another_codec() {
    use ketch_storage::batch::Records;
    use ketch_tests::batch::{self, CODECS, Codec, Record};
    use ketch_tests::raw::{self, KafkaConn, code};

    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let rt = runtime();
    let records: Vec<Record> = (0..40)
        .map(|i| Record {
            timestamp: batch::at(i),
            key: Some(format!("k{i}").into_bytes()),
            value: (i % 7 != 0).then(|| value(i as usize)),
            headers: vec![("h".to_owned(), Some(b"x".to_vec()))],
        })
        .collect();
    let inputs: Vec<(Option<Codec>, Vec<u8>)> = std::iter::once((None, batch::encode(&records)))
        .chain(
            CODECS
                .iter()
                .map(|c| (Some(*c), batch::encode_compressed(&records, *c, 40))),
        )
        .collect();
    for (target, bits) in [
        ("uncompressed", 0),
        ("gzip", 1),
        ("snappy", 2),
        ("lz4", 3),
        ("zstd", 4),
    ] {
        let topic = unique_topic(&format!("to-{target}"));
        ketch.create_topic_with(&rt, &topic, 1, &[("compression.type", target)]);
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        for (_, batch) in &inputs {
            assert_eq!(
                raw::produce(&mut conn, &topic, 0, batch.clone()).0,
                code::NONE,
                "{target}"
            );
        }
        let mut next = 0;
        let mut stored = Vec::new();
        while next < 40 * inputs.len() as i64 {
            let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, next, 0));
            let (error, _, bytes) = raw::fetch_result(&response);
            assert_eq!(error, code::NONE);
            for batch in raw::split_batches(bytes.expect("records")) {
                stored.push(batch);
                next += 40;
            }
        }
        for ((input_codec, sent), batch) in inputs.iter().zip(&stored) {
            let attributes = i16::from_be_bytes(batch[21..23].try_into().unwrap());
            assert_eq!(attributes & 7, bits, "{target} from {input_codec:?}");
            if input_codec.map_or(0, |c| c as i16) == bits {
                assert_eq!(
                    &batch[16..],
                    &sent[16..],
                    "{target}: a batch in the topic's codec is kept as sent"
                );
            }
            let mut decoded = Records::of_batch(batch).expect("a valid batch");
            for (i, want) in records.iter().enumerate() {
                let got = decoded.next_record().expect("a record").expect("40 records");
                assert_eq!(got.offset_delta, i as i32);
                assert_eq!(got.timestamp, want.timestamp);
                assert_eq!(got.key.as_deref(), want.key.as_deref());
                assert_eq!(got.value.as_deref(), want.value.as_deref(), "{target} record {i}");
                assert_eq!(got.headers.len(), 1);
            }
            assert!(decoded.next_record().unwrap().is_none());
        }
        // A real client reads every record (CRCs checked).
        let consumer = ketch.consumer_with(&[("check.crcs", "true")]);
        let mut assignment = rdkafka::TopicPartitionList::new();
        assignment
            .add_partition_offset(&topic, 0, rdkafka::Offset::Offset(0))
            .unwrap();
        rdkafka::consumer::Consumer::assign(&consumer, &assignment).unwrap();
        let mut seen = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen < 40 * inputs.len() {
            assert!(Instant::now() < deadline, "{target}: consumed {seen}");
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                assert_eq!(m.expect("valid").offset(), seen as i64);
                seen += 1;
            }
        }
    }
}

/// zstd came with Produce v7 and Fetch v10 (KIP-110): an older produce of a
/// zstd batch is UNSUPPORTED_COMPRESSION_TYPE with nothing stored, and an
/// older fetch of a topic whose `compression.type` is zstd gets that error
/// without records, as from Kafka. Under `producer`, the batches are
/// served as stored to every version, as Kafka serves them (Sarama's
/// default fetch version reads zstd; a refusal stopped it at the first
/// zstd batch, and hid the batches before it).
#[test]
fn zstd_needs_produce_v7_and_fetch_v10() {
    use ketch_tests::batch::{self, Codec, Record};
    use ketch_tests::raw::{self, KafkaConn, code};
    const UNSUPPORTED_COMPRESSION_TYPE: i16 = 76;

    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("zstd-versions");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let records = [Record::value(batch::at(0), b"squeezed")];
    let zstd = batch::encode_compressed(&records, Codec::Zstd, 1);
    let produce = |conn: &mut KafkaConn, version: i16| {
        let response = conn.request(version, &raw::produce_request(&topic, 0, zstd.clone()));
        raw::produce_result(&response)
    };
    assert_eq!(produce(&mut conn, 6).0, UNSUPPORTED_COMPRESSION_TYPE);
    assert_eq!(produce(&mut conn, 7), (code::NONE, 0), "nothing stored before");
    let fetch = |conn: &mut KafkaConn, version: i16| {
        let response = conn.request(version, &raw::fetch_request(&topic, 0, 0, 0));
        let partition = &response.responses[0].partitions[0];
        (
            partition.error_code,
            partition.records.as_ref().map_or(0, |r| r.len()),
        )
    };
    let (error, at_v9) = fetch(&mut conn, 9);
    assert_eq!(error, code::NONE, "a producer's zstd batch, read at v9");
    let (error, bytes) = fetch(&mut conn, 10);
    assert_eq!(error, code::NONE);
    assert!(bytes > 0 && bytes == at_v9, "read at v10 as at v9");

    // A topic whose compression.type is zstd is refused to an older fetch
    // by its config, as Kafka does, before it holds any batch.
    let configured = unique_topic("zstd-configured");
    assert_eq!(raw::create_topic(&mut conn, &configured, 1), code::NONE);
    assert_eq!(
        raw::set_topic_config(&mut conn, &configured, "compression.type", "zstd"),
        code::NONE
    );
    let response = conn.request(9, &raw::fetch_request(&configured, 0, 0, 0));
    assert_eq!(
        response.responses[0].partitions[0].error_code,
        UNSUPPORTED_COMPRESSION_TYPE
    );
    // Also when the fetch names a partition the topic does not have
    // first: that one keeps its own error.
    let response = conn.request(
        9,
        &raw::fetch_partitions_request(&configured, &[(99, 0), (0, 0)], 1 << 20),
    );
    let codes: Vec<i16> = response.responses[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(
        codes,
        [code::UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_COMPRESSION_TYPE]
    );
}

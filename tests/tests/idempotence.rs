//! Idempotent producers (issue #6, first part): InitProducerId, retried
//! batches answered with their original offset, gaps and stale epochs
//! refused — through the raw protocol, and with rdkafka's idempotent
//! producer end to end.

use std::time::Duration;

use kafka_protocol::messages::{InitProducerIdRequest, ProducerId};
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};
use rdkafka::Message;
use rdkafka::producer::FutureRecord;

const INVALID_REQUEST: i16 = 42;
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const UNKNOWN_PRODUCER_ID: i16 = 59;

fn init_producer_id(conn: &mut KafkaConn, id: i64, epoch: i16) -> (i16, i64, i16) {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(id))
        .with_producer_epoch(epoch);
    let response = conn.request(4, &request);
    (
        response.error_code,
        response.producer_id.0,
        response.producer_epoch,
    )
}

fn record(n: i64) -> Vec<Record> {
    vec![Record::value(1_000 + n, format!("r{n}").as_bytes())]
}

#[test]
fn retries_are_deduplicated_and_gaps_and_stale_epochs_refused() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("idempotence");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);

    let (error, id, epoch) = init_producer_id(&mut conn, -1, -1);
    assert_eq!((error, epoch), (code::NONE, 0));
    let (_, other, _) = init_producer_id(&mut conn, -1, -1);
    assert_ne!(id, other, "every producer gets its own id");

    let produce = |conn: &mut KafkaConn, n: i64, epoch: i16, seq: i32| {
        raw::produce(
            conn,
            &topic,
            0,
            batch::encode_idempotent(&record(n), id, epoch, seq),
        )
    };
    assert_eq!(produce(&mut conn, 0, 0, 0), (code::NONE, 0));
    assert_eq!(produce(&mut conn, 1, 0, 1), (code::NONE, 1));
    assert_eq!(produce(&mut conn, 2, 0, 2), (code::NONE, 2));
    // A retry of an acknowledged batch gets its original offset; nothing is stored twice.
    assert_eq!(produce(&mut conn, 1, 0, 1), (code::NONE, 1));
    assert_eq!(redis.next_offset(&topic, 0), 3);
    // A gap in the sequence is refused, and so is an older epoch.
    assert_eq!(produce(&mut conn, 9, 0, 9).0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    // KIP-360: a producer that names its id after an error gets a new one,
    // as from Kafka: naming an id never hands it over.
    let (error, renewed, epoch) = init_producer_id(&mut conn, id, 0);
    assert_eq!((error, epoch), (code::NONE, 0));
    assert!(renewed != id && renewed != other, "a new id, not the one named");
    // A batch of a newer epoch starts at sequence 0; the older epoch is
    // refused from then on.
    assert_eq!(
        produce(&mut conn, 3, 1, 0),
        (code::NONE, 3),
        "a new epoch starts at 0"
    );
    assert_eq!(produce(&mut conn, 4, 0, 3).0, INVALID_PRODUCER_EPOCH);
    // An id and an epoch come together or not at all.
    assert_eq!(init_producer_id(&mut conn, id, -1).0, INVALID_REQUEST);
    assert_eq!(init_producer_id(&mut conn, -1, 3).0, INVALID_REQUEST);
    // A producer this partition never saw must start at sequence 0.
    let stranger = raw::produce(
        &mut conn,
        &topic,
        0,
        batch::encode_idempotent(&record(5), other, 0, 7),
    );
    assert_eq!(stranger.0, UNKNOWN_PRODUCER_ID);
    assert_eq!(
        redis.next_offset(&topic, 0),
        4,
        "refused batches left nothing behind"
    );
}

#[test]
fn rdkafka_idempotent_producer_round_trips() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("idempotent-rdkafka");
    let rt = ketch_tests::runtime();
    ketch.create_topic(&rt, &topic, 4);
    let producer = ketch.producer_with(&[("enable.idempotence", "true"), ("linger.ms", "5")]);
    let deliveries: Vec<_> = (0..2_000)
        .map(|i| {
            let value = format!("v{i}");
            let key = format!("k{}", i % 4);
            producer
                .send_result(
                    FutureRecord::to(&topic)
                        .key(&key)
                        .payload(&value)
                        .partition(i % 4),
                )
                .map_err(|(e, _)| e)
                .expect("queued")
        })
        .collect();
    for delivery in deliveries {
        rt.block_on(delivery)
            .expect("delivered")
            .map_err(|(e, _)| e)
            .expect("acknowledged");
    }
    let consumer = ketch.consumer_at(&topic, &[0, 1, 2, 3], 0);
    let mut seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen < 2_000 {
        assert!(std::time::Instant::now() < deadline, "consumed {seen} of 2000");
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            let message = message.expect("consume");
            let value = std::str::from_utf8(message.payload().unwrap())
                .unwrap()
                .to_owned();
            let i: i32 = value[1..].parse().unwrap();
            assert_eq!(message.partition(), i % 4);
            seen += 1;
        }
    }
    for p in 0..4 {
        assert_eq!(
            redis.next_offset(&topic, p),
            500,
            "partition {p}: every record once"
        );
    }
}

#[test]
fn idle_producer_state_expires_like_kafkas() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "producers.expiration=300ms",
            "--set",
            "tiering.tick_interval=100ms",
            "--set",
            "tiering.lease_ttl=1s",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("producer-expiry");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (_, id, _) = init_producer_id(&mut conn, -1, -1);
    let produce = |conn: &mut KafkaConn, n: i64, seq: i32| {
        raw::produce(conn, &topic, 0, batch::encode_idempotent(&record(n), id, 0, seq)).0
    };
    assert_eq!(produce(&mut conn, 0, 0), code::NONE);
    assert_eq!(produce(&mut conn, 1, 1), code::NONE);

    // The storage worker forgets the idle producer; that is visible in Redis only.
    let key = format!("ketch:{{{}}}:producers", redis.topic_tags(&topic)[0]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let known: bool = redis::cmd("HEXISTS")
            .arg(&key)
            .arg(id)
            .query(&mut redis.connection())
            .unwrap();
        if !known {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "producer state never expired"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // As with Kafka: the next sequence is unknown, a restart at 0 is accepted.
    assert_eq!(produce(&mut conn, 2, 2), UNKNOWN_PRODUCER_ID);
    assert_eq!(produce(&mut conn, 2, 0), code::NONE);
}

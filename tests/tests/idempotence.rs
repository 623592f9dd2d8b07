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
    vec![Record::value(batch::at(1_000 + n), format!("r{n}").as_bytes())]
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
    // Redis taken back to before both (a failover to a replica that had
    // not seen them, a crash under appendfsync everysec) hands neither out
    // again once its clock has moved on, as it has by the time it serves.
    let mut redis_conn = redis.connection();
    let () = redis::cmd("SET")
        .arg("ketch:producer-ids")
        .arg(1)
        .query(&mut redis_conn)
        .expect("SET");
    let millis = |conn: &mut ketch_tests::TestConnection| {
        let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).expect("TIME");
        s * 1000 + us / 1000
    };
    let latest = id.max(other);
    while millis(&mut redis_conn) + 999 <= latest {
        std::thread::yield_now();
    }
    let (_, after, _) = init_producer_id(&mut conn, -1, -1);
    assert!(after > latest, "id {after} handed out after {id} and {other}");

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
    assert_eq!(
        redis.next_offset(&topic, 0),
        4,
        "refused batches left nothing behind"
    );
    // A producer this partition never saw may start at any sequence, as in
    // Kafka; its sequence goes on from there.
    let stranger = |n: i64, seq: i32| batch::encode_idempotent(&record(n), other, 0, seq);
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, stranger(5, 7)),
        (code::NONE, 4)
    );
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, stranger(5, 7)),
        (code::NONE, 4),
        "a retry"
    );
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, stranger(6, 9)).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, stranger(6, 8)),
        (code::NONE, 5)
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
    // As with Kafka: a producer the partition no longer knows goes on at
    // its next sequence (a client told UNKNOWN_PRODUCER_ID would only send
    // the same batch again until its delivery timeout).
    assert_eq!(produce(&mut conn, 2, 2), code::NONE);
    assert_eq!(produce(&mut conn, 3, 3), code::NONE);
    assert_eq!(produce(&mut conn, 4, 5), OUT_OF_ORDER_SEQUENCE_NUMBER);
}

/// Layout 3 (issue #14): idempotent producers' state is stored compact
/// instead of JSON, but only once no gateway of an older release can read
/// it. While one is live in the registry the layout stays 2 and states
/// stay JSON; once it leaves, the gateway takes the last step, and each
/// producer's next append rewrites its state compact. Retries of batches
/// acknowledged under JSON are still answered with their offsets, and the
/// sequence goes on across the change.
#[test]
fn producer_state_turns_compact_once_no_older_gateway_is_live() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse};

    let redis = TestRedis::start();
    let layout = || -> Option<String> {
        redis::cmd("HGET")
            .arg("ketch:layout")
            .arg("version")
            .query(&mut redis.connection())
            .expect("HGET ketch:layout")
    };
    // A namespace at layout 2, with a gateway of the previous release in
    // the registry: its entry names no layout. Its heartbeat is stamped in
    // the future, so it stays live until the test removes it.
    let (seconds, _): (i64, i64) = redis::cmd("TIME").query(&mut redis.connection()).expect("TIME");
    let older = serde_json::json!({"host": "127.0.0.1", "port": 9, "instance": "older", "heartbeat_ms": (seconds + 600) * 1000});
    let _: () = redis::cmd("HSET")
        .arg("ketch:layout")
        .arg("version")
        .arg(2)
        .query(&mut redis.connection())
        .expect("layout 2");
    let _: () = redis::cmd("HSET")
        .arg("ketch:brokers")
        .arg(9)
        .arg(older.to_string())
        .query(&mut redis.connection())
        .expect("an older gateway");
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "cluster.heartbeat_interval=100ms",
            "--set",
            "cluster.layout_step_delay=300ms",
        ],
    );
    assert!(
        ketch.logs("the Redis layout stays at version 2 while these gateways of an older release run"),
        "{}",
        ketch.output()
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("compact-state");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (_, id, _) = init_producer_id(&mut conn, -1, -1);
    let produce = |conn: &mut KafkaConn, seq: i32| {
        raw::produce(
            conn,
            &topic,
            0,
            batch::encode_idempotent(&record(i64::from(seq)), id, 0, seq),
        )
    };
    for seq in 0..7 {
        assert_eq!(produce(&mut conn, seq), (code::NONE, i64::from(seq)));
    }
    assert_eq!(layout().as_deref(), Some("2"));
    let state = redis.producer_state(&topic, 0, id).expect("state");
    assert_eq!(state.first(), Some(&b'{'), "JSON while an older gateway runs");

    // The older gateway leaves: the layout becomes 3.
    let _: () = redis::cmd("HDEL")
        .arg("ketch:brokers")
        .arg(9)
        .query(&mut redis.connection())
        .expect("HDEL");
    assert!(
        ketch.logs("migrated the Redis layout: every live gateway serves it"),
        "{}",
        ketch.output()
    );
    assert_eq!(layout().as_deref(), Some("3"));
    // Retries of batches acknowledged under JSON (the last five are kept).
    assert_eq!(produce(&mut conn, 6), (code::NONE, 6));
    assert_eq!(produce(&mut conn, 2), (code::NONE, 2));
    let state = redis.producer_state(&topic, 0, id).expect("state");
    assert_eq!(state.first(), Some(&1), "a retry rewrites the state compact");
    assert_eq!(
        produce(&mut conn, 1).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER,
        "older than the last five"
    );
    assert_eq!(produce(&mut conn, 7), (code::NONE, 7));
    assert_eq!(
        produce(&mut conn, 7),
        (code::NONE, 7),
        "a retry under the compact state"
    );
    assert_eq!(produce(&mut conn, 9).0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(redis.next_offset(&topic, 0), 8, "every batch once");

    let response: DescribeProducersResponse = conn.request(
        0,
        &DescribeProducersRequest::default().with_topics(vec![
            TopicRequest::default()
                .with_name(raw::topic_name(&topic))
                .with_partition_indexes(vec![0]),
        ]),
    );
    let producers = &response.topics[0].partitions[0].active_producers;
    assert_eq!(producers.len(), 1);
    assert_eq!(
        (
            producers[0].producer_id.0,
            producers[0].producer_epoch,
            producers[0].last_sequence
        ),
        (id, 0, 7)
    );
    assert!(producers[0].last_timestamp > 0);
    // A name no topic can have is INVALID_TOPIC_EXCEPTION (17), as Kafka says.
    let response: DescribeProducersResponse = conn.request(
        0,
        &DescribeProducersRequest::default().with_topics(vec![
            TopicRequest::default()
                .with_name(raw::topic_name("no such/topic"))
                .with_partition_indexes(vec![0]),
        ]),
    );
    assert_eq!(response.topics[0].partitions[0].error_code, 17);

    // A gateway of the older release that joins now cannot read compact
    // state: the gateway says so.
    let _: () = redis::cmd("HSET")
        .arg("ketch:brokers")
        .arg(9)
        .arg(older.to_string())
        .query(&mut redis.connection())
        .expect("the older gateway again");
    assert!(
        ketch.logs("gateways of an older release serve beside Redis layout 3"),
        "{}",
        ketch.output()
    );
}

/// The producer state's two encodings (`scripts/producer_state.lua`) carry
/// the same state in every shape the scripts write: with and without a
/// transaction, its first offset, the last ended transaction, and with no
/// batches or five. The compact bytes Lua writes decode in Rust
/// (DescribeProducers) to what the JSON does.
#[test]
fn the_producer_state_codec_keeps_every_shape() {
    let redis = TestRedis::start();
    let states = [
        r#"{"e":0,"t":1700000000123,"b":[[0,0,5]]}"#,
        r#"{"e":2,"t":1700000000123,"b":[[0,4,10],[5,9,15],[10,10,20],[11,20,21],[21,2147483647,31]]}"#,
        r#"{"e":7,"t":1,"b":{},"x":{"n":3,"e":7}}"#,
        r#"{"e":7,"t":1,"b":[[0,0,40]],"x":{"n":3,"e":7,"f":40},"l":-1}"#,
        r#"{"e":32767,"t":1700000000999,"b":[[3,3,9007199254740000]],"l":12}"#,
    ];
    // Each state: decoded from JSON, encoded compact, decoded again, and
    // encoded as JSON; both decodings are compared field by field.
    let script = concat!(
        include_str!("../../storage/src/scripts/producer_state.lua"),
        r#"
local function canon(s)
  local x = s.x and string.format('%d/%d/%s', s.x.n, s.x.e, tostring(s.x.f)) or '-'
  local b = {}
  for i = 1, #s.b do b[i] = string.format('%d', s.b[i]) end
  return string.format('%d|%d|%s|%s|%s', s.e, s.t, x, tostring(s.l), table.concat(b, ','))
end
local from_json = decode_state(ARGV[1])
local compact = encode_state(from_json, '1')
local from_compact = decode_state(compact)
local json = encode_state(from_compact, '0')
return {canon(from_json), canon(from_compact), canon(decode_state(json)), compact, json}
"#
    );
    for state in states {
        let (from_json, from_compact, again, compact, json): (String, String, String, Vec<u8>, String) =
            redis::cmd("EVAL")
                .arg(script)
                .arg(0)
                .arg(state)
                .query(&mut redis.connection())
                .expect("EVAL the codec");
        assert_eq!(from_compact, from_json, "{state}");
        assert_eq!(again, from_json, "{state}");
        assert_eq!(compact.first(), Some(&1), "{state}");
        assert!(json.starts_with('{') && json.contains(r#""b":["#), "{json}");
        let rust = ketch_storage::decode_producer_state(&compact);
        assert!(rust.is_some(), "{state}");
        assert_eq!(
            rust,
            ketch_storage::decode_producer_state(state.as_bytes()),
            "{state}"
        );
    }
}

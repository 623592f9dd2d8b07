//! Client quotas as Kafka tools and clients meet them: AlterClientQuotas
//! and DescribeClientQuotas with Kafka's checks and filters, a quota set
//! through one gateway enforced by another, producers answered with a
//! throttle time and their connection not read meanwhile (old request
//! versions: the response held back), consumers given empty throttled
//! fetches and responses no larger than the quota's window, clients over
//! their request_percentage throttled by the thread time of their requests.
//!
//! Raw protocol: rdkafka has no quota admin API, and these tests read
//! throttle_time_ms and time single requests. The gateways measure rates
//! over two 1 s samples (`quotas.window_num=2`), so a client may send one
//! second's worth of its quota before it is throttled.

use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse,
};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};

const WINDOWS: &[&str] = &["--set", "quotas.window_num=2", "--set", "quotas.window_size=1s"];

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// An entity from (type, name) pairs; a `None` name is the default entity.
fn entity(parts: &[(&str, Option<&str>)]) -> Vec<EntityData> {
    parts
        .iter()
        .map(|(kind, name)| {
            EntityData::default()
                .with_entity_type(s(kind))
                .with_entity_name(name.map(s))
        })
        .collect()
}

fn set(key: &str, value: f64) -> OpData {
    OpData::default().with_key(s(key)).with_value(value)
}

fn remove(key: &str) -> OpData {
    OpData::default().with_key(s(key)).with_remove(true)
}

/// (error code, message) of each entry of one AlterClientQuotas.
fn alter(
    conn: &mut KafkaConn,
    entries: Vec<(Vec<EntityData>, Vec<OpData>)>,
    validate_only: bool,
) -> Vec<(i16, String)> {
    let request = AlterClientQuotasRequest::default()
        .with_entries(
            entries
                .into_iter()
                .map(|(entity, ops)| EntryData::default().with_entity(entity).with_ops(ops))
                .collect(),
        )
        .with_validate_only(validate_only);
    let response: AlterClientQuotasResponse = conn.request(1, &request);
    response
        .entries
        .iter()
        .map(|e| {
            (
                e.error_code,
                e.error_message.as_deref().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn alter_ok(conn: &mut KafkaConn, parts: &[(&str, Option<&str>)], ops: Vec<OpData>) {
    assert_eq!(
        alter(conn, vec![(entity(parts), ops)], false),
        [(code::NONE, String::new())]
    );
}

/// One described entity: its (type, name) parts and its (key, value)s.
type Described = (Vec<(String, Option<String>)>, Vec<(String, f64)>);

/// DescribeClientQuotas with components (type, match type, match).
fn describe(
    conn: &mut KafkaConn,
    components: &[(&str, i8, Option<&str>)],
    strict: bool,
) -> Result<Vec<Described>, (i16, String)> {
    let request = DescribeClientQuotasRequest::default()
        .with_components(
            components
                .iter()
                .map(|(kind, match_type, name)| {
                    ComponentData::default()
                        .with_entity_type(s(kind))
                        .with_match_type(*match_type)
                        .with_match(name.map(s))
                })
                .collect(),
        )
        .with_strict(strict);
    let response: DescribeClientQuotasResponse = conn.request(1, &request);
    if response.error_code != code::NONE {
        return Err((
            response.error_code,
            response.error_message.as_deref().unwrap_or_default().to_owned(),
        ));
    }
    Ok(response
        .entries
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let parts = e
                .entity
                .iter()
                .map(|p| {
                    (
                        p.entity_type.to_string(),
                        p.entity_name.as_ref().map(|n| n.to_string()),
                    )
                })
                .collect();
            let values = e.values.iter().map(|v| (v.key.to_string(), v.value)).collect();
            (parts, values)
        })
        .collect())
}

fn parts(list: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    list.iter()
        .map(|(k, n)| ((*k).to_owned(), n.map(str::to_owned)))
        .collect()
}

const EXACT: i8 = 0;
const DEFAULT: i8 = 1;
const SPECIFIED: i8 = 2;

#[test]
fn quotas_are_altered_and_described_as_kafka_does() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &["--node-id", "1"]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    let mut on_a = KafkaConn::connect(a.kafka_addr());
    let mut on_b = KafkaConn::connect(b.kafka_addr());

    let alice = [("user", Some("alice"))];
    let alice_app = [("user", Some("alice")), ("client-id", Some("app"))];
    let default_client = [("client-id", None)];
    let default_ip = [("ip", None)];
    let results = alter(
        &mut on_a,
        vec![
            (
                entity(&alice),
                vec![
                    set("producer_byte_rate", 1_048_576.0),
                    set("request_percentage", 12.5),
                ],
            ),
            (entity(&alice_app), vec![set("consumer_byte_rate", 2048.0)]),
            (
                entity(&default_client),
                vec![set("controller_mutation_rate", 0.5)],
            ),
            (entity(&default_ip), vec![set("connection_creation_rate", 30.0)]),
        ],
        false,
    );
    assert!(results.iter().all(|(c, _)| *c == code::NONE), "{results:?}");
    assert!(a.logs("client quotas changed"), "no audit line:\n{}", a.output());
    // Removals are not validated, as by Kafka: one of a key no entity
    // holds removes nothing and is answered NONE (the connection goes on).
    alter_ok(&mut on_a, &alice, vec![remove("no\nsuch-key")]);

    // Refused as Kafka refuses them; a refused entry changes nothing, the
    // request's valid entries still apply.
    let refused: Vec<(Vec<EntityData>, Vec<OpData>, &str)> = vec![
        (
            entity(&[("user", Some("bob1"))]),
            vec![set("retention.ms", 5.0)],
            "Invalid configuration key retention.ms",
        ),
        (
            entity(&[("user", Some("bob2"))]),
            vec![set("producer_byte_rate", 10.5)],
            "cannot be a fractional value",
        ),
        (
            entity(&[("user", Some("bob3"))]),
            vec![set("producer_byte_rate", 0.0)],
            "must be greater than 0",
        ),
        (
            entity(&[("user", Some("bob4"))]),
            vec![set("producer_byte_rate", 1e30)],
            "too large for a LONG",
        ),
        (
            entity(&[("ip", None)]),
            vec![set("producer_byte_rate", 5.0)],
            "Invalid configuration key",
        ),
        (
            entity(&[("ip", Some("10.0.0.1")), ("user", Some("bob5"))]),
            vec![set("connection_creation_rate", 5.0)],
            "IP entity",
        ),
        (
            entity(&[("ip", Some("not-an-address"))]),
            vec![set("connection_creation_rate", 5.0)],
            "not a valid IP",
        ),
        (
            entity(&[("group", Some("g"))]),
            vec![set("producer_byte_rate", 5.0)],
            "Unhandled client quota entity type",
        ),
        (
            entity(&[]),
            vec![set("producer_byte_rate", 5.0)],
            "Invalid empty client quota entity",
        ),
        (
            entity(&[("user", Some(""))]),
            vec![set("producer_byte_rate", 5.0)],
            "Empty user not supported",
        ),
        (
            entity(&[("user", Some("carol"))]),
            vec![set("producer_byte_rate", 5.0), set("producer_byte_rate", 6.0)],
            "Duplicate quota key",
        ),
    ];
    let expected: Vec<&str> = refused.iter().map(|r| r.2).collect();
    let mut entries: Vec<(Vec<EntityData>, Vec<OpData>)> =
        refused.into_iter().map(|(e, o, _)| (e, o)).collect();
    entries.push((
        entity(&[("user", Some("dave"))]),
        vec![set("producer_byte_rate", 4096.0)],
    ));
    entries.push((
        entity(&[("user", Some("dave"))]),
        vec![set("producer_byte_rate", 8192.0)],
    ));
    let results = alter(&mut on_a, entries, false);
    for ((error, message), want) in results.iter().zip(&expected) {
        assert_eq!(*error, code::INVALID_REQUEST, "{message}");
        assert!(message.contains(want), "{message:?} does not say {want:?}");
    }
    let n = expected.len();
    assert_eq!(results[n], (code::NONE, String::new()));
    assert_eq!(results[n + 1].0, code::INVALID_REQUEST);
    assert!(
        results[n + 1].1.contains("Ignoring duplicate entity"),
        "{:?}",
        results[n + 1]
    );

    // validate_only stores nothing.
    let checked = alter(
        &mut on_a,
        vec![(
            entity(&[("user", Some("erin"))]),
            vec![set("producer_byte_rate", 100.0)],
        )],
        true,
    );
    assert_eq!(checked, [(code::NONE, String::new())]);

    // Described through the other gateway at once (read from Redis).
    let users = describe(&mut on_b, &[("user", SPECIFIED, None)], false).unwrap();
    let names: Vec<_> = users.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(
        names,
        [parts(&alice), parts(&alice_app), parts(&[("user", Some("dave"))])],
        "every entity with a user, no erin (validate_only) nor bob or carol (refused)"
    );
    let alice_only = describe(&mut on_b, &[("user", EXACT, Some("alice"))], true).unwrap();
    assert_eq!(
        alice_only,
        [(
            parts(&alice),
            vec![
                ("producer_byte_rate".to_owned(), 1_048_576.0),
                ("request_percentage".to_owned(), 12.5)
            ]
        )]
    );
    assert_eq!(
        describe(&mut on_b, &[("user", EXACT, Some("alice"))], false)
            .unwrap()
            .len(),
        2,
        "not strict: alice's client-id entity too"
    );
    assert_eq!(
        describe(&mut on_b, &[("client-id", DEFAULT, None)], false).unwrap(),
        [(
            parts(&default_client),
            vec![("controller_mutation_rate".to_owned(), 0.5)]
        )]
    );
    assert_eq!(
        describe(&mut on_b, &[("ip", DEFAULT, None)], true).unwrap(),
        [(
            parts(&default_ip),
            vec![("connection_creation_rate".to_owned(), 30.0)]
        )]
    );
    assert_eq!(
        describe(&mut on_b, &[], false).unwrap().len(),
        5,
        "an empty filter matches all"
    );
    assert_eq!(
        describe(&mut on_b, &[], true).unwrap().len(),
        0,
        "strict and empty matches none"
    );

    // Bad filters.
    let bad = [
        (
            vec![("user", EXACT, None)],
            code::INVALID_REQUEST,
            "MATCH_TYPE_EXACT",
        ),
        (
            vec![("user", DEFAULT, Some("x"))],
            code::INVALID_REQUEST,
            "MATCH_TYPE_DEFAULT",
        ),
        (
            vec![("user", SPECIFIED, None), ("user", DEFAULT, None)],
            code::INVALID_REQUEST,
            "more than once",
        ),
        (
            vec![("ip", SPECIFIED, None), ("user", SPECIFIED, None)],
            code::INVALID_REQUEST,
            "IP filter",
        ),
        (
            vec![("group", SPECIFIED, None)],
            code::UNSUPPORTED_VERSION,
            "Unsupported entity type",
        ),
        (
            vec![("user", 7, None)],
            code::INVALID_REQUEST,
            "Unknown match type",
        ),
    ];
    for (components, error, message) in bad {
        let (got, text) = describe(&mut on_a, &components, false).unwrap_err();
        assert_eq!(got, error, "{components:?}: {text}");
        assert!(text.contains(message), "{text:?} does not say {message:?}");
    }

    // Removing a key; removing the last one removes the entity.
    alter_ok(&mut on_b, &alice, vec![remove("request_percentage")]);
    alter_ok(&mut on_b, &alice_app, vec![remove("consumer_byte_rate")]);
    let users = describe(&mut on_a, &[("user", EXACT, Some("alice"))], false).unwrap();
    assert_eq!(
        users,
        [(
            parts(&alice),
            vec![("producer_byte_rate".to_owned(), 1_048_576.0)]
        )]
    );
}

/// Produces a batch of `bytes` with the given request version; (error,
/// throttle_time_ms, time to the response).
fn produce_timed(conn: &mut KafkaConn, version: i16, topic: &str, bytes: usize) -> (i16, i32, Duration) {
    let batch = batch::encode(&[Record::value(batch::at(0), &vec![b'q'; bytes])]);
    let request: ProduceRequest = raw::produce_request(topic, 0, batch);
    let sent = Instant::now();
    let response: ProduceResponse = conn.request(version, &request);
    let took = sent.elapsed();
    (raw::produce_result(&response).0, response.throttle_time_ms, took)
}

#[test]
fn a_producer_over_its_quota_is_throttled_by_every_gateway() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &[&["--node-id", "1"], WINDOWS].concat());
    let b = Ketch::start(&redis.url(), &[&["--node-id", "2"], WINDOWS].concat());
    let topic = unique_topic("quota-produce");
    let mut admin = KafkaConn::connect(a.kafka_addr());
    assert_eq!(raw::create_topic(&mut admin, &topic, 1), code::NONE);
    // 20 kB/s for the client id "slow", set through A.
    alter_ok(
        &mut admin,
        &[("client-id", Some("slow"))],
        vec![set("producer_byte_rate", 20_000.0)],
    );

    // B enforces it once the change reaches it: 10 kB requests, within a
    // few seconds they are over the quota (the first over it by little,
    // then by half: about 500 ms).
    let mut slow = KafkaConn::connect_as(b.kafka_addr(), "slow");
    let altered = Instant::now();
    let mut produced = 0;
    let throttle = loop {
        let (error, throttle, _) = produce_timed(&mut slow, 9, &topic, 10_000);
        assert_eq!(
            error,
            code::NONE,
            "a throttled producer's records are stored all the same"
        );
        produced += 1;
        if throttle >= 200 {
            break throttle;
        }
        assert!(
            altered.elapsed() < Duration::from_secs(10),
            "gateway B never throttled the producer"
        );
    };
    println!(
        "throttled {throttle} ms after {produced} requests, {:?}",
        altered.elapsed()
    );
    assert!((1..=5_000).contains(&throttle), "throttle {throttle} ms");
    // The connection is not read until the throttle time has passed: the
    // next request is answered no sooner.
    let (error, _, took) = produce_timed(&mut slow, 9, &topic, 100);
    assert_eq!(error, code::NONE);
    assert!(
        took + Duration::from_millis(50) >= Duration::from_millis(throttle as u64),
        "answered after {took:?} within a throttle of {throttle} ms"
    );

    // Another client id has no quota; the same client id on gateway A has
    // its own measure there (quotas are enforced per gateway, as per
    // Kafka broker).
    let mut other = KafkaConn::connect_as(b.kafka_addr(), "other");
    assert_eq!(produce_timed(&mut other, 9, &topic, 10_000).1, 0);
    let mut slow_on_a = KafkaConn::connect_as(a.kafka_addr(), "slow");
    assert_eq!(produce_timed(&mut slow_on_a, 9, &topic, 10_000).1, 0);

    // A Produce v5 client does not wait by itself; as from Kafka since
    // KIP-219, its response is not held back (its records are stored, and
    // a client that timed out would send them again), but its connection
    // is not read until the throttle time has passed.
    let mut old = KafkaConn::connect_as(a.kafka_addr(), "slow");
    let throttle = loop {
        let (error, throttle, _) = produce_timed(&mut old, 5, &topic, 10_000);
        assert_eq!(error, code::NONE);
        if throttle >= 200 {
            break throttle;
        }
    };
    let (error, _, took) = produce_timed(&mut old, 5, &topic, 100);
    assert_eq!(error, code::NONE);
    assert!(
        took + Duration::from_millis(50) >= Duration::from_millis(throttle as u64),
        "the next v5 request was answered after {took:?} within a throttle of {throttle} ms"
    );

    // Every record is there, in order.
    let offsets = raw::list_offsets(&mut admin, &topic, 0, -1);
    assert_eq!(offsets.0, code::NONE);
    assert!(
        offsets.1 >= produced + 4,
        "{offsets:?} after {produced} + 4 produced"
    );
    let metrics = b.http_get("/metrics").1;
    assert!(
        metrics.contains("ketch_quota_throttled_requests_total{quota=\"produce\"}"),
        "{metrics}"
    );

    // Removed: B stops throttling.
    alter_ok(
        &mut admin,
        &[("client-id", Some("slow"))],
        vec![remove("producer_byte_rate")],
    );
    let removed = Instant::now();
    let mut fresh = KafkaConn::connect_as(b.kafka_addr(), "slow");
    let mut unthrottled = 0;
    while unthrottled < 5 {
        let (_, throttle, _) = produce_timed(&mut fresh, 9, &topic, 10_000);
        unthrottled = if throttle == 0 { unthrottled + 1 } else { 0 };
        assert!(
            removed.elapsed() < Duration::from_secs(10),
            "B kept throttling after the quota was removed"
        );
    }
}

fn fetch(conn: &mut KafkaConn, topic: &str, offset: i64) -> (FetchResponse, Duration) {
    let request: FetchRequest = raw::fetch_request(topic, 0, offset, 0).with_max_bytes(1 << 24);
    let sent = Instant::now();
    let response = conn.request(raw::FETCH_VERSION, &request);
    (response, sent.elapsed())
}

#[test]
fn a_consumer_over_its_quota_gets_empty_throttled_fetches_and_still_reads_everything() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WINDOWS);
    let topic = unique_topic("quota-fetch");
    let mut admin = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut admin, &topic, 1), code::NONE);
    // 40 batches of 5 kB.
    for i in 0..40u8 {
        let batch = batch::encode(&[Record::value(batch::at(0), &[i; 5000])]);
        assert_eq!(raw::produce(&mut admin, &topic, 0, batch).0, code::NONE);
    }
    // 30 kB/s for every user's clients (the default user: here ANONYMOUS).
    alter_ok(
        &mut admin,
        &[("user", None)],
        vec![set("consumer_byte_rate", 30_000.0)],
    );

    let mut consumer = KafkaConn::connect_as(ketch.kafka_addr(), "reader");
    let mut offset = 0;
    let mut throttled = 0;
    let started = Instant::now();
    while offset < 40 {
        let (response, _) = fetch(&mut consumer, &topic, offset);
        if response.throttle_time_ms > 0 {
            throttled += 1;
            assert!(response.responses.is_empty(), "a throttled fetch carries no data");
            continue;
        }
        let (error, _, records) = raw::fetch_result(&response);
        assert_eq!(error, code::NONE);
        let batches = raw::split_batches(records.unwrap_or_default());
        assert!(!batches.is_empty(), "no data at offset {offset}");
        let bytes: usize = batches.iter().map(|b| b.len()).sum();
        // One response takes no more than one window's worth (30 kB), or
        // one batch where a batch is larger.
        assert!(bytes <= 30_000, "a fetch of {bytes} bytes under a 30 kB/s quota");
        for batch in batches {
            let base = i64::from_be_bytes(batch[..8].try_into().unwrap());
            assert_eq!(base, offset, "records in order, none skipped");
            offset += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "stuck at offset {offset}"
        );
    }
    assert!(throttled > 0, "200 kB at 30 kB/s and never throttled");
    println!(
        "read 200 kB at 30 kB/s in {:?}, {throttled} throttled fetches",
        started.elapsed()
    );
}

#[test]
fn connections_over_an_addresss_creation_rate_are_closed_unanswered() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WINDOWS);
    let mut admin = KafkaConn::connect(ketch.kafka_addr());
    // Three new connections a second from 127.0.0.1 (the default for
    // other addresses is higher: this one applies).
    alter_ok(
        &mut admin,
        &[("ip", None)],
        vec![set("connection_creation_rate", 100.0)],
    );
    alter_ok(
        &mut admin,
        &[("ip", Some("127.0.0.1"))],
        vec![set("connection_creation_rate", 3.0)],
    );

    // Whether a new connection's ApiVersions is answered (else the
    // connection is closed without a word).
    let answered = || {
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        conn.send(3, &kafka_protocol::messages::ApiVersionsRequest::default());
        conn.read_frame().is_ok()
    };
    let started = Instant::now();
    let mut accepted = 0;
    while answered() {
        accepted += 1;
        assert!(
            accepted < 50,
            "50 connections in {:?} and none refused",
            started.elapsed()
        );
    }
    assert!(
        accepted >= 3,
        "refused after {accepted} connections in {:?}",
        started.elapsed()
    );
    // The open connection is not affected, and once the quota is removed
    // new connections are accepted again.
    alter_ok(
        &mut admin,
        &[("ip", Some("127.0.0.1"))],
        vec![remove("connection_creation_rate")],
    );
    for _ in 0..10 {
        assert!(answered(), "a connection refused under the 100/s default");
    }
    let metrics = ketch.http_get("/metrics").1;
    assert!(
        metrics.contains("ketch_quota_throttled_requests_total{quota=\"connection\"}"),
        "{metrics}"
    );
}

const THROTTLING_QUOTA_EXCEEDED: i16 = 89;

/// Creates one topic of `partitions` with a CreateTopics of `version`:
/// (error, message, throttle_time_ms, time to the response).
fn create_timed(
    conn: &mut KafkaConn,
    version: i16,
    topic: &str,
    partitions: i32,
) -> (i16, String, i32, Duration) {
    let sent = Instant::now();
    let response: kafka_protocol::messages::CreateTopicsResponse =
        conn.request(version, &raw::create_topic_request(topic, partitions));
    let took = sent.elapsed();
    let result = &response.topics[0];
    let message = result.error_message.as_deref().unwrap_or_default().to_owned();
    (result.error_code, message, response.throttle_time_ms, took)
}

/// The controller mutation tokens are one bucket for every gateway, as
/// Kafka's one active controller keeps them: spent through one gateway,
/// they are spent through another.
#[test]
fn controller_mutation_tokens_are_shared_by_every_gateway() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &[&["--node-id", "1"], WINDOWS].concat());
    let b = Ketch::start(&redis.url(), &[&["--node-id", "2"], WINDOWS].concat());
    let mut on_a = KafkaConn::connect_as(a.kafka_addr(), "provisioner");
    // 0.5 partitions a second: a burst of 1, back after 2 s a partition.
    alter_ok(
        &mut on_a,
        &[("client-id", Some("provisioner"))],
        vec![set("controller_mutation_rate", 0.5)],
    );
    let mut on_b = KafkaConn::connect_as(b.kafka_addr(), "provisioner");
    let topic = unique_topic("shared-tokens");
    // B has the quota once the change reaches it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    loop {
        i += 1;
        let (error, _, _, _) = create_timed(&mut on_b, 7, &format!("{topic}-b{i}"), 4);
        if error == THROTTLING_QUOTA_EXCEEDED {
            break;
        }
        assert_eq!(error, code::NONE);
        assert!(Instant::now() < deadline, "gateway B never applied the quota");
    }
    // Spent through B (overdrawn by several seconds' worth): refused
    // through A too, which this client never used.
    let (error, message, throttle, _) = create_timed(&mut on_a, 7, &format!("{topic}-a"), 1);
    assert_eq!(error, THROTTLING_QUOTA_EXCEEDED, "{message}");
    assert!(throttle > 0, "throttle {throttle} ms");
}

#[test]
fn topic_changes_over_the_controller_mutation_rate_are_refused_or_throttled() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WINDOWS);
    let mut admin = KafkaConn::connect_as(ketch.kafka_addr(), "provisioner");
    // 2 partitions a second for this client id: with two 1 s samples, a
    // burst of 4.
    alter_ok(
        &mut admin,
        &[("client-id", Some("provisioner"))],
        vec![set("controller_mutation_rate", 2.0)],
    );
    let topic = unique_topic("mutations");
    let name = |i: u32| format!("{topic}-{i}");

    // CreateTopics v7 (strict): the tokens may be overdrawn once, then a
    // topic is refused with the time until they are back.
    assert_eq!(create_timed(&mut admin, 7, &name(1), 3).0, code::NONE);
    assert_eq!(create_timed(&mut admin, 7, &name(2), 3).0, code::NONE);
    let (error, message, throttle, _) = create_timed(&mut admin, 7, &name(3), 3);
    assert_eq!(error, THROTTLING_QUOTA_EXCEEDED, "{message}");
    assert_eq!(message, "The throttling quota has been exceeded.");
    assert!(
        (1..=1_000).contains(&throttle),
        "throttle {throttle} ms for 2 tokens owed at 2/s"
    );
    // Muted meanwhile: the next request is answered no sooner.
    let (mut error, _, _, took) = create_timed(&mut admin, 7, &name(3), 3);
    assert!(
        took + Duration::from_millis(50) >= Duration::from_millis(throttle as u64),
        "answered after {took:?} within a throttle of {throttle} ms"
    );
    // Refused when the tokens were not quite back yet: asked again (each
    // answer after the throttle time) until created, so the tokens are
    // overdrawn by 3 (1.5 s at 2/s) right before the deletes below.
    let started = Instant::now();
    while error != code::NONE {
        assert_eq!(error, THROTTLING_QUOTA_EXCEEDED);
        assert!(started.elapsed() < Duration::from_secs(15), "never created");
        error = create_timed(&mut admin, 7, &name(3), 3).0;
    }

    // DeleteTopics v6 (strict) counts the topic's partitions too: refused
    // while the tokens are spent, accepted once they are back.
    let delete = |conn: &mut KafkaConn| {
        let request = kafka_protocol::messages::DeleteTopicsRequest::default()
            .with_topics(vec![
                kafka_protocol::messages::delete_topics_request::DeleteTopicState::default()
                    .with_name(Some(raw::topic_name(&name(1)))),
            ])
            .with_timeout_ms(10_000);
        let response: kafka_protocol::messages::DeleteTopicsResponse = conn.request(6, &request);
        response.responses[0].error_code
    };
    let mut deleter = KafkaConn::connect_as(ketch.kafka_addr(), "provisioner");
    assert_eq!(delete(&mut deleter), THROTTLING_QUOTA_EXCEEDED);
    let started = Instant::now();
    loop {
        match delete(&mut deleter) {
            code::NONE => break,
            THROTTLING_QUOTA_EXCEEDED => {}
            other => panic!("DeleteTopics answered {other}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the tokens never came back"
        );
    }
    // CreateTopics v4 (before KIP-599's error): created, with a throttle
    // time the client waits out (and its connection is muted meanwhile).
    let mut old = KafkaConn::connect_as(ketch.kafka_addr(), "provisioner");
    let (error, _, throttle, _) = create_timed(&mut old, 4, &name(4), 3);
    assert_eq!(error, code::NONE);
    assert!(throttle > 0, "an overdraft of the quota and no throttle time");
    let sent = Instant::now();
    let _: kafka_protocol::messages::ApiVersionsResponse =
        old.request(3, &kafka_protocol::messages::ApiVersionsRequest::default());
    assert!(
        sent.elapsed() + Duration::from_millis(50) >= Duration::from_millis(throttle as u64),
        "answered after {:?} within a throttle of {throttle} ms",
        sent.elapsed()
    );
    // CreateTopics v2 (before KIP-219): the client does not wait by
    // itself; as from Kafka, its response comes at once all the same, and
    // its next request waits in the muted connection.
    let mut older = KafkaConn::connect_as(ketch.kafka_addr(), "provisioner");
    let (error, _, throttle, _) = create_timed(&mut older, 2, &name(8), 1);
    assert_eq!(error, code::NONE);
    assert!(throttle > 0);
    let sent = Instant::now();
    let _: kafka_protocol::messages::ApiVersionsResponse =
        older.request(3, &kafka_protocol::messages::ApiVersionsRequest::default());
    assert!(
        sent.elapsed() + Duration::from_millis(50) >= Duration::from_millis(throttle as u64),
        "the request after a v2 response was answered after {:?} within a throttle of {throttle} ms",
        sent.elapsed()
    );

    // Another client id is not limited.
    let mut other = KafkaConn::connect_as(ketch.kafka_addr(), "someone-else");
    for i in 5..8 {
        assert_eq!(create_timed(&mut other, 7, &name(i), 3).0, code::NONE);
    }
}

#[test]
fn requests_over_the_request_percentage_are_throttled() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WINDOWS);
    let topic = unique_topic("quota-request");
    let mut admin = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut admin, &topic, 1), code::NONE);
    // 1 % of one thread: 10 ms of thread time per second, which some tens
    // of produce requests use up (the rate spans at least one second).
    alter_ok(
        &mut admin,
        &[("client-id", Some("busy"))],
        vec![set("request_percentage", 1.0)],
    );
    let mut busy = KafkaConn::connect_as(ketch.kafka_addr(), "busy");
    let started = Instant::now();
    let (mut sent, mut first) = (0, None);
    let throttle = loop {
        let (error, throttle, _) = produce_timed(&mut busy, 9, &topic, 100);
        assert_eq!(error, code::NONE, "a throttled request is still served");
        sent += 1;
        if throttle > 0 && first.is_none() {
            first = Some(sent);
        }
        // Kafka bounds a request-time throttle by one quota window (1 s here).
        assert!(throttle <= 1_000, "throttle {throttle} ms");
        if throttle >= 100 {
            break throttle;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not throttled 100 ms after {sent} requests"
        );
    };
    println!("first throttled after {first:?} requests; {throttle} ms after {sent}");
    assert!(
        first > Some(1),
        "the first request alone cannot use 10 ms of thread time"
    );
    // The connection is not read until the throttle time has passed.
    let (error, _, took) = produce_timed(&mut busy, 9, &topic, 100);
    assert_eq!(error, code::NONE);
    assert!(
        took + Duration::from_millis(50) >= Duration::from_millis(throttle as u64),
        "answered after {took:?} within a throttle of {throttle} ms"
    );
    // Another client id has no quota.
    let mut idle = KafkaConn::connect_as(ketch.kafka_addr(), "idle");
    for _ in 0..20 {
        assert_eq!(produce_timed(&mut idle, 9, &topic, 100).1, 0);
    }
    let metrics = ketch.http_get("/metrics").1;
    assert!(
        metrics.contains("ketch_quota_throttled_requests_total{quota=\"request\"}"),
        "{metrics}"
    );
}

/// A batch larger than the consumer's quota allows over its whole window
/// (one response may carry quota × (samples − 1) × window) is sent anyway,
/// with the throttle it earns: the first batch of a fetch always goes out
/// (KIP-74), and taken back, as a response over the quota is, the next
/// fetch found the same batch and the consumer never moved past it.
#[test]
fn a_batch_larger_than_the_quota_window_is_sent_throttled_not_withheld_for_ever() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WINDOWS);
    let topic = unique_topic("quota-large-batch");
    let mut admin = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut admin, &topic, 1), code::NONE);
    let batch = batch::encode(&[Record::value(batch::at(0), &[7; 50_000])]);
    assert_eq!(
        raw::produce(&mut admin, &topic, 0, batch.clone()),
        (code::NONE, 0)
    );
    // 1 kB/s: far less than the batch over any window.
    alter_ok(
        &mut admin,
        &[("user", None)],
        vec![set("consumer_byte_rate", 1_000.0)],
    );
    let mut consumer = KafkaConn::connect_as(ketch.kafka_addr(), "reader");
    let (response, _) = fetch(&mut consumer, &topic, 0);
    let (error, _, records) = raw::fetch_result(&response);
    assert_eq!(error, code::NONE);
    let batches = raw::split_batches(records.unwrap_or_default());
    assert_eq!(batches.len(), 1, "the batch is sent");
    assert_eq!(batches[0].len(), batch.len());
    // Throttled for what it took: 50 kB at 1 kB/s.
    assert!(
        response.throttle_time_ms >= 30_000,
        "throttle {} ms",
        response.throttle_time_ms
    );
}

/// Whether a new connection from `from` is served (an ApiVersions v0
/// answered), rather than closed as it is accepted.
fn served_from(from: std::net::IpAddr, ketch: &Ketch) -> bool {
    use std::io::{Read, Write};
    let mut stream = ketch_tests::tcp_connect_from(from, ketch.kafka_addr());
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let api_versions = [0u8, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 255, 255];
    let mut size = [0u8; 4];
    stream.write_all(&api_versions).is_ok() && stream.read_exact(&mut size).is_ok()
}

/// A connection muted by a throttle far longer than
/// `broker.connections_max_idle` is closed once idle that long, as Kafka
/// closes an idle connection muted or not: a client that went away while
/// throttled held its places (here the address's only one) until the
/// throttle ended.
#[test]
fn a_muted_connection_is_closed_once_idle_for_connections_max_idle() {
    let redis = TestRedis::start();
    let args = [
        WINDOWS,
        &[
            "--set",
            "broker.connections_max_idle=2s",
            "--set",
            "broker.max_connections_per_ip=1",
        ],
    ]
    .concat();
    let ketch = Ketch::start(&redis.url(), &args);
    let topic = unique_topic("quota-muted");
    let mut admin = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut admin, &topic, 1), code::NONE);
    // 1 kB/s for every user's clients (the default user: here ANONYMOUS).
    alter_ok(
        &mut admin,
        &[("user", None)],
        vec![set("producer_byte_rate", 1_000.0)],
    );
    let client: std::net::IpAddr = [127, 0, 0, 5].into();
    let mut slow = KafkaConn::connect_from(client, ketch.kafka_addr());
    // 50 kB at 1 kB/s: muted for about 50 s.
    let (error, throttle, _) = produce_timed(&mut slow, 9, &topic, 50_000);
    assert_eq!(error, code::NONE);
    assert!(throttle >= 30_000, "throttled {throttle} ms");
    // A request read while muted waits; then the client goes away.
    slow.send(3, &kafka_protocol::messages::ApiVersionsRequest::default());
    drop(slow);
    assert!(
        !served_from(client, &ketch),
        "the address's one place is still held"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served_from(client, &ketch) {
        assert!(
            Instant::now() < deadline,
            "the muted connection still holds its place"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

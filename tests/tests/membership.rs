//! Gateway membership (DESIGN §6): every live gateway is in Metadata,
//! partition leaders and group coordinators are spread over them by
//! rendezvous hashing, and a dead gateway's share moves to the others.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{FindCoordinatorRequest, HeartbeatRequest, OffsetFetchRequest};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::raw::{self, KafkaConn};
use ketch_tests::{Ketch, TestRedis, unique_topic};
use rdkafka::consumer::Consumer;

const UNKNOWN_MEMBER_ID: i16 = 25;

fn gateway(redis: &TestRedis, id: i32) -> Ketch {
    Ketch::start_node(&redis.url(), id, "600ms", &[])
}

/// (broker ids, leader id of each partition) as `via` reports them.
fn metadata(via: &Ketch, topic: &str) -> (BTreeSet<i32>, Vec<i32>) {
    let metadata = via
        .consumer()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let brokers = metadata.brokers().iter().map(|b| b.id()).collect();
    let leaders = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.leader())
        .collect();
    (brokers, leaders)
}

/// Polls Metadata until `done` holds: membership converges through
/// heartbeats, and Metadata is the only place a client can see it.
fn wait_for_metadata(via: &Ketch, topic: &str, what: &str, done: impl Fn(&BTreeSet<i32>, &[i32]) -> bool) {
    wait_for_metadata_within(via, topic, Duration::from_secs(15), what, done);
}

fn wait_for_metadata_within(
    via: &Ketch,
    topic: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&BTreeSet<i32>, &[i32]) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let (brokers, leaders) = metadata(via, topic);
        if done(&brokers, &leaders) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: brokers {brokers:?}, leaders {leaders:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn metadata_lists_live_gateways_and_moves_a_dead_ones_partitions() {
    let redis = TestRedis::start();
    let mut gateways: Vec<Ketch> = (1..=3).map(|id| gateway(&redis, id)).collect();
    let topic = unique_topic("membership");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(gateways[0].kafka_addr()), &topic, 24),
        0
    );

    let all = BTreeSet::from([1, 2, 3]);
    wait_for_metadata(&gateways[0], &topic, "three gateways", |brokers, _| {
        *brokers == all
    });
    let (_, leaders) = metadata(&gateways[1], &topic);
    let leading: BTreeSet<i32> = leaders.iter().copied().collect();
    assert_eq!(leading, all, "24 partitions spread over all three gateways");
    // Every gateway computes the same leaders.
    assert_eq!(metadata(&gateways[2], &topic).1, leaders);

    gateways[2].kill9();
    wait_for_metadata(&gateways[0], &topic, "gateway 3 gone", |brokers, leaders| {
        *brokers == BTreeSet::from([1, 2]) && leaders.iter().all(|l| *l != 3)
    });
    let (_, after) = metadata(&gateways[1], &topic);
    for (before, after) in leaders.iter().zip(&after) {
        if *before != 3 {
            assert_eq!(before, after, "a partition moved though its leader lives");
        }
    }
}

/// A gateway that joins or leaves says so (heartbeat.lua, deregister.lua):
/// the others list it in Metadata at once, not at their next heartbeat, so
/// clients do not get brokers lists that disagree for a heartbeat.
#[test]
fn a_joining_or_leaving_gateway_is_announced_to_the_others() {
    let redis = TestRedis::start();
    // Heartbeats far apart: only the announcements can tell in time.
    let start = |id: &str| {
        Ketch::start(
            &redis.url(),
            &[
                "--node-id",
                id,
                "--set",
                "cluster.heartbeat_interval=30s",
                "--set",
                "cluster.node_timeout=90s",
            ],
        )
    };
    let a = start("1");
    let topic = unique_topic("membership");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(a.kafka_addr()), &topic, 4),
        0
    );
    assert_eq!(metadata(&a, &topic).0, BTreeSet::from([1]));
    let mut b = start("2");
    let within = Duration::from_secs(5);
    wait_for_metadata_within(&a, &topic, within, "gateway 2 joined", |brokers, _| {
        *brokers == BTreeSet::from([1, 2])
    });
    b.terminate();
    assert!(b.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()));
    wait_for_metadata_within(&a, &topic, within, "gateway 2 left", |brokers, leaders| {
        *brokers == BTreeSet::from([1]) && leaders.iter().all(|l| *l == 1)
    });
}

#[test]
fn groups_spread_over_coordinators_and_every_gateway_answers_for_every_group() {
    let redis = TestRedis::start();
    let gateways: Vec<Ketch> = (1..=3).map(|id| gateway(&redis, id)).collect();
    let topic = unique_topic("coordinators");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(gateways[0].kafka_addr()), &topic, 1),
        0
    );
    let all = BTreeSet::from([1, 2, 3]);
    for g in &gateways {
        wait_for_metadata(g, &topic, "three gateways", |brokers, _| *brokers == all);
    }

    let mut coordinators = BTreeSet::new();
    for n in 0..30 {
        let group = format!("group-{n}");
        let find = FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.clone()));
        let answers: Vec<i32> = gateways
            .iter()
            .map(|g| {
                let response = KafkaConn::connect(g.kafka_addr()).request(3, &find);
                assert_eq!(response.error_code, 0);
                response.node_id.0
            })
            .collect();
        assert!(
            answers.iter().all(|a| *a == answers[0]),
            "{group}: gateways disagree: {answers:?}"
        );
        coordinators.insert(answers[0]);

        // Offsets are read from Redis anywhere; group requests reaching
        // another gateway are forwarded to the coordinator, which answers
        // (here: an unknown member).
        for (id, g) in (1..=3).zip(&gateways) {
            let fetch = OffsetFetchRequest::default()
                .with_group_id(StrBytes::from_string(group.clone()).into())
                .with_topics(None);
            let response = KafkaConn::connect(g.kafka_addr()).request(7, &fetch);
            assert_eq!(
                response.error_code, 0,
                "{group}: OffsetFetch asked of gateway {id}"
            );
            let heartbeat = HeartbeatRequest::default()
                .with_group_id(StrBytes::from_string(group.clone()).into())
                .with_member_id(StrBytes::from_static_str("nobody"))
                .with_generation_id(1);
            let response = KafkaConn::connect(g.kafka_addr()).request(4, &heartbeat);
            assert_eq!(
                response.error_code, UNKNOWN_MEMBER_ID,
                "{group}: Heartbeat asked of gateway {id}, forwarded to node {}",
                answers[0]
            );
        }
    }
    assert_eq!(coordinators, all, "30 groups spread over all three coordinators");
}

/// A group whose members and coordinator go away together is taken over by
/// the next coordinator without a request for it, as Kafka's loads every
/// group of its offsets partition: its members' sessions run out there, it
/// empties, and its offsets expire after `groups.offsets_retention` (they
/// were kept for ever: nothing loaded the group, and offsets are read from
/// Redis without it); so does the snapshot of a group that never
/// committed.
#[test]
fn an_abandoned_groups_offsets_expire_under_its_next_coordinator() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest, SyncGroupRequest};

    let redis = TestRedis::start();
    let settings = [
        "--set",
        "groups.min_session_timeout=1s",
        "--set",
        "groups.initial_rebalance_delay=0s",
        "--set",
        "groups.offsets_retention=2s",
    ];
    let mut a = Ketch::start_node(&redis.url(), 1, "600ms", &settings);
    let b = Ketch::start_node(&redis.url(), 2, "600ms", &settings);
    let topic = unique_topic("abandoned");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(a.kafka_addr()), &topic, 1),
        0
    );
    for g in [&a, &b] {
        wait_for_metadata(g, &topic, "two gateways", |brokers, _| {
            *brokers == BTreeSet::from([1, 2])
        });
    }
    // Two groups gateway 1 coordinates: a consumer group that commits,
    // and a Kafka Connect group that never does.
    let mut conn = KafkaConn::connect(a.kafka_addr());
    let mut of_gateway_1 = (0..).map(|n| format!("{topic}-group-{n}")).filter(|group| {
        let find = FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.clone()));
        conn.request(3, &find).node_id.0 == 1
    });
    let (group, connect) = (
        of_gateway_1.next().expect("a group of gateway 1"),
        of_gateway_1.next().expect("a group of gateway 1"),
    );
    let mut form = |group: &str, protocol_type: &'static str| {
        let join = JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
            .with_session_timeout_ms(1_000)
            .with_rebalance_timeout_ms(1_000)
            .with_protocol_type(StrBytes::from_static_str(protocol_type))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("range"))
                    .with_metadata(bytes::Bytes::from_static(b"m")),
            ]);
        let joined = conn.request(3, &join);
        assert_eq!(joined.error_code, 0);
        let sync = SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
            .with_member_id(joined.member_id.clone())
            .with_generation_id(joined.generation_id);
        assert_eq!(conn.request(3, &sync).error_code, 0);
        joined
    };
    let joined = form(&group, "consumer");
    form(&connect, "connect");
    let commit = raw::offset_commit_request(&group, &joined.member_id, joined.generation_id, &topic, 0, 5);
    assert_eq!(conn.request(8, &commit).topics[0].partitions[0].error_code, 0);
    // The Connect group's snapshot is written (its expiry is checked below).
    let snapshot = format!("ketch:group:{{{connect}}}:state");
    let written = Instant::now() + Duration::from_secs(10);
    while !redis::cmd("EXISTS")
        .arg(&snapshot)
        .query::<bool>(&mut redis.connection())
        .expect("EXISTS")
    {
        assert!(
            Instant::now() < written,
            "the Connect group's snapshot was never written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The coordinator dies, and with it the member (it never leaves).
    a.kill9();
    wait_for_metadata(&b, &topic, "gateway 1 gone", |brokers, _| {
        *brokers == BTreeSet::from([2])
    });
    let committed = |conn: &mut KafkaConn| {
        let fetch = OffsetFetchRequest::default()
            .with_group_id(StrBytes::from_string(group.clone()).into())
            .with_topics(None);
        let response = conn.request(7, &fetch);
        assert_eq!(response.error_code, 0);
        response
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .map(|p| p.committed_offset)
            .next()
            .unwrap_or(-1)
    };
    let mut conn = KafkaConn::connect(b.kafka_addr());
    // Session (1 s) and retention (2 s) after the takeover, with room.
    let deadline = Instant::now() + Duration::from_secs(20);
    while committed(&mut conn) != -1 {
        assert!(
            Instant::now() < deadline,
            "the abandoned group's offsets are kept for ever"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The group that never committed empties too, and its snapshot
    // expires (it was kept for ever, and brought back with its dead member
    // whenever the group id was used again).
    while redis::cmd("EXISTS")
        .arg(&snapshot)
        .query::<bool>(&mut redis.connection())
        .expect("EXISTS")
    {
        assert!(
            Instant::now() < deadline,
            "the abandoned group's snapshot is kept for ever"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

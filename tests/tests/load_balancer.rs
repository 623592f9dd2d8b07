//! Gateways behind a TCP load balancer (HAProxy on loopback), started
//! without node ids and all advertising the load balancer's address:
//! clients see one broker, every request works on whichever gateway its
//! connection lands on (group requests are forwarded to the group's
//! coordinator), a coordinator's death costs no rebalance to generation 1,
//! and node ids are claimed without collisions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    DescribeGroupsRequest, FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest,
    JoinGroupResponse, MetadataRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::raw::{self, KafkaConn};
use ketch_tests::servers::{Balanced, Haproxy};
use ketch_tests::{Ketch, TestRedis, runtime, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;

/// Node ids above this name addresses several gateways share.
const MAX_NODE_ID: i32 = (1 << 30) - 1;
const ILLEGAL_GENERATION: i16 = 22;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

type Stack = Balanced;

/// Redis, `n` gateways and HAProxy in front of them, once every gateway
/// sees all the others.
fn stack(n: usize) -> Stack {
    Balanced::start(n, &[])
}

fn stack_with(n: usize, extra: &[&str]) -> Stack {
    Balanced::start(n, extra)
}

fn config(lb: &Haproxy) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", lb.bootstrap())
        .set("broker.address.family", "v4")
        .set("socket.timeout.ms", "15000");
    config
}

fn group_consumer(lb: &Haproxy, group: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = config(lb)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("partition.assignment.strategy", "range")
        .create()
        .expect("create consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

fn assigned(consumer: &BaseConsumer) -> usize {
    consumer.assignment().map_or(0, |a| a.count())
}

/// Polls every consumer until their assignments have the sizes `want`
/// (in any order).
fn await_assignment(consumers: &[&BaseConsumer], want: &[usize], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut want = want.to_vec();
    want.sort_unstable();
    loop {
        for c in consumers {
            if let Some(Err(e)) = c.poll(Duration::from_millis(50)) {
                eprintln!("consumer error: {e}");
            }
        }
        let mut sizes: Vec<usize> = consumers.iter().map(|c| assigned(c)).collect();
        sizes.sort_unstable();
        if sizes == want {
            return;
        }
        assert!(Instant::now() < deadline, "assignments {sizes:?}, want {want:?}");
    }
}

#[test]
fn behind_a_load_balancer_clients_see_one_broker_and_groups_split_over_every_gateway() {
    let stack = stack(3);
    let lb = &stack.lb;

    // Metadata through the load balancer and from each gateway directly:
    // one broker, the load balancer, under an id no gateway can hold.
    let topic = unique_topic("behind-lb");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(lb.addr()), &topic, 12),
        0
    );
    let mut ids = BTreeSet::new();
    for addr in std::iter::once(lb.addr()).chain(stack.gateways.iter().map(Ketch::kafka_addr)) {
        let metadata = KafkaConn::connect(addr).request(
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(raw::topic_name(&topic))),
            ])),
        );
        assert_eq!(metadata.brokers.len(), 1, "{addr}: {:?}", metadata.brokers);
        let broker = &metadata.brokers[0];
        assert_eq!(
            (broker.host.as_str(), broker.port),
            ("127.0.0.1", i32::from(lb.port()))
        );
        assert!(broker.node_id.0 > MAX_NODE_ID, "shared id {}", broker.node_id.0);
        assert!(
            metadata.topics[0]
                .partitions
                .iter()
                .all(|p| p.leader_id == broker.node_id),
            "every partition is led by the one broker"
        );
        let coordinator =
            KafkaConn::connect(addr).request(3, &FindCoordinatorRequest::default().with_key(s("any-group")));
        assert_eq!(coordinator.node_id, broker.node_id);
        assert_eq!(coordinator.port, i32::from(lb.port()));
        ids.insert(broker.node_id.0);
    }
    assert_eq!(ids.len(), 1, "every gateway reports the same id: {ids:?}");

    // The admin API lists the one broker, and the three gateways behind it
    // (the console showed one), each with its own internal listener.
    let (status, body) = stack.gateways[0].http_get("/api/v1/brokers");
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(listed["brokers"].as_array().map(Vec::len), Some(1), "{listed}");
    let gateways = listed["gateways"].as_array().expect("gateways");
    let internal: BTreeSet<&str> = gateways.iter().filter_map(|g| g["internal"].as_str()).collect();
    assert_eq!((gateways.len(), internal.len()), (3, 3), "{listed}");
    assert!(
        gateways
            .iter()
            .all(|g| g["broker_id"] == serde_json::json!(ids.first().copied())),
        "{listed}"
    );
    assert_eq!(
        gateways
            .iter()
            .filter(|g| g["this_gateway"] == serde_json::json!(true))
            .count(),
        1
    );

    // A three-member group through the load balancer splits 12 partitions
    // 4/4/4, whichever gateways its members' connections landed on; then
    // 6/6 once one leaves.
    let group = unique_topic("lb-group");
    let consumers: Vec<BaseConsumer> = (0..3).map(|_| group_consumer(lb, &group, &topic)).collect();
    let all: Vec<&BaseConsumer> = consumers.iter().collect();
    await_assignment(&all, &[4, 4, 4], Duration::from_secs(60));
    let mut consumers = consumers;
    let leaving = consumers.pop().expect("a consumer");
    leaving.unsubscribe();
    drop(leaving);
    let rest: Vec<&BaseConsumer> = consumers.iter().collect();
    await_assignment(&rest, &[6, 6], Duration::from_secs(60));
    drop(stack);
}

#[test]
fn a_gateway_killed_behind_the_load_balancer_loses_no_record_and_no_committed_offset() {
    let mut stack = stack(3);
    let topic = unique_topic("lb-kill");
    let partitions = 6;
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(stack.lb.addr()), &topic, partitions),
        0
    );
    let total = 3000usize;
    let rt = runtime();

    // An idempotent producer through the load balancer, on its own thread.
    let producer: rdkafka::producer::FutureProducer = config(&stack.lb)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("create producer");
    let produced = Arc::new(AtomicBool::new(false));
    let producing = {
        let (topic, produced) = (topic.clone(), produced.clone());
        thread::spawn(move || {
            let rt = runtime();
            for i in 0..total {
                let value = format!("record-{i}");
                let key = i.to_string();
                let sent = rt.block_on(producer.send(
                    FutureRecord::to(&topic).key(&key).payload(&value),
                    Duration::from_secs(60),
                ));
                sent.unwrap_or_else(|(e, _)| panic!("record {i} not delivered: {e}"));
                if i % 10 == 0 {
                    thread::sleep(Duration::from_millis(2));
                }
            }
            produced.store(true, Ordering::SeqCst);
        })
    };

    // Two group members consume and commit as they go.
    let group = unique_topic("lb-kill-group");
    let consumers = [
        group_consumer(&stack.lb, &group, &topic),
        group_consumer(&stack.lb, &group, &topic),
    ];
    let mut seen = BTreeSet::new();
    let mut committed_before_kill: Option<BTreeMap<i32, i64>> = None;
    let mut killed: Option<usize> = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    while seen.len() < total {
        assert!(
            Instant::now() < deadline,
            "consumed {} of {total} distinct records",
            seen.len()
        );
        for consumer in &consumers {
            match consumer.poll(Duration::from_millis(50)) {
                Some(Ok(message)) => {
                    let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
                    seen.insert(value);
                    let _ = consumer.commit_message(&message, CommitMode::Async);
                }
                Some(Err(e)) => eprintln!("consumer error (retried): {e}"),
                None => {}
            }
        }
        if killed.is_none() && seen.len() >= total / 3 {
            // Kill the group's coordinator: the group must go on with
            // another, from its snapshot in Redis.
            committed_before_kill = Some(committed(&stack.lb, &group, &topic, partitions));
            let coordinator = coordinator_of(&stack, &group);
            stack.gateways[coordinator].kill9();
            killed = Some(coordinator);
            eprintln!(
                "killed the coordinator, gateway {coordinator}, after {} records",
                seen.len()
            );
        }
    }
    producing.join().expect("producer thread");
    assert!(produced.load(Ordering::SeqCst));
    for consumer in &consumers {
        consumer.commit_consumer_state(CommitMode::Sync).ok();
    }

    // Exactly once: the partitions hold every record once.
    let mut stored = 0i64;
    let mut conn = KafkaConn::connect(stack.lb.addr());
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (error, end, _) = raw::list_offsets(&mut conn, &topic, p, -1);
        assert_eq!(error, 0);
        stored += end;
        ends.insert(p, end);
    }
    assert_eq!(stored, total as i64, "records stored once each across the kill");
    assert_eq!(seen.len(), total, "every record consumed");

    // No committed offset went back: what was committed before the kill is
    // still there (or later), and the final commits reach the end.
    let before = committed_before_kill.expect("killed mid-run");
    let after = committed(&stack.lb, &group, &topic, partitions);
    for (p, offset) in &before {
        assert!(
            after.get(p).copied().unwrap_or(-1) >= *offset,
            "partition {p}: committed {offset} before the kill, {:?} after",
            after.get(p)
        );
    }
    assert_eq!(after, ends, "final commits reach every partition's end");
    let killed = killed.expect("killed mid-run");
    let took_over = format!("group={group} generation=");
    assert!(
        stack
            .gateways
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != killed)
            .any(|(_, g)| g
                .output()
                .lines()
                .any(|l| l.contains("took the group over from its snapshot") && l.contains(&took_over))),
        "a surviving gateway took the group over from its snapshot"
    );
    drop(rt);
    drop(stack.redis);
}

/// The group's committed offsets of `topic` (partitions without one left out).
fn committed(lb: &Haproxy, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = config(lb)
        .set("group.id", group)
        .create()
        .expect("create consumer");
    let mut list = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let found = consumer
        .committed_offsets(list, Duration::from_secs(30))
        .expect("committed offsets");
    found
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

fn join(conn: &mut KafkaConn, group: &str, member_id: &str) -> JoinGroupResponse {
    join_with(conn, group, member_id, 10_000)
}

fn join_with(
    conn: &mut KafkaConn,
    group: &str,
    member_id: &str,
    session_timeout_ms: i32,
) -> JoinGroupResponse {
    let request = JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(session_timeout_ms)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member_id))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(bytes::Bytes::from_static(b"subscription")),
        ]);
    conn.request(7, &request)
}

/// A member id through the MEMBER_ID_REQUIRED round trip.
fn member_id(conn: &mut KafkaConn, group: &str) -> String {
    let response = join(conn, group, "");
    assert_eq!(response.error_code, 79, "MEMBER_ID_REQUIRED");
    response.member_id.to_string()
}

/// Three members, each talking to a different gateway directly (so at
/// least two are forwarded), join `group` in one rebalance and sync: their
/// member ids and the generation.
fn form_group(stack: &Stack, group: &str, session_timeout_ms: i32) -> (Vec<String>, i32) {
    let addrs: Vec<_> = stack.gateways.iter().map(Ketch::kafka_addr).collect();
    let members: Vec<String> = addrs
        .iter()
        .map(|a| member_id(&mut KafkaConn::connect(*a), group))
        .collect();
    let joins: Vec<_> = addrs
        .iter()
        .zip(&members)
        .map(|(addr, member)| {
            let (addr, member, group) = (*addr, member.clone(), group.to_owned());
            thread::spawn(move || {
                join_with(&mut KafkaConn::connect(addr), &group, &member, session_timeout_ms)
            })
        })
        .collect();
    let joined: Vec<JoinGroupResponse> = joins.into_iter().map(|j| j.join().expect("join")).collect();
    let generation = joined[0].generation_id;
    for j in &joined {
        assert_eq!(j.error_code, 0, "{j:?}");
        assert_eq!(j.generation_id, generation, "one rebalance for all three");
    }
    let leader = joined[0].leader.to_string();
    let assignments: Vec<SyncGroupRequestAssignment> = members
        .iter()
        .map(|m| {
            SyncGroupRequestAssignment::default()
                .with_member_id(s(m))
                .with_assignment(bytes::Bytes::from(format!("for {m}")))
        })
        .collect();
    let syncs: Vec<_> = addrs
        .iter()
        .zip(&members)
        .map(|(addr, member)| {
            let mut request = SyncGroupRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id(generation)
                .with_member_id(s(member));
            if *member == leader {
                request = request.with_assignments(assignments.clone());
            }
            let addr = *addr;
            thread::spawn(move || KafkaConn::connect(addr).request(3, &request))
        })
        .collect();
    for (sync, member) in syncs.into_iter().zip(&members) {
        let sync = sync.join().expect("sync");
        assert_eq!(sync.error_code, 0);
        assert_eq!(&sync.assignment[..], format!("for {member}").as_bytes());
    }
    (members, generation)
}

/// Every member's heartbeat at `generation`, asked of `via`.
fn heartbeats(via: std::net::SocketAddr, group: &str, members: &[String], generation: i32) -> Vec<i16> {
    members
        .iter()
        .map(|m| {
            let heartbeat = HeartbeatRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id(generation)
                .with_member_id(s(m));
            KafkaConn::connect(via).request(4, &heartbeat).error_code
        })
        .collect()
}

#[test]
fn a_coordinator_paused_past_its_lease_forgets_its_groups_instead_of_expiring_them() {
    let stack = stack_with(3, &["--set", "groups.initial_rebalance_delay=2s"]);
    let group = unique_topic("lb-pause");
    // The shortest session Kafka allows by default: the pause outlasts it.
    let (members, generation) = form_group(&stack, &group, 6_000);
    let coordinator = coordinator_of(&stack, &group);
    let survivor = (0..3).find(|i| *i != coordinator).expect("a survivor");
    let via = stack.gateways[survivor].kafka_addr();

    // Pause the coordinator for longer than the members' session timeout
    // while they heartbeat through another gateway: once the others take
    // it for dead, a new coordinator loads the group and keeps it alive.
    let paused = ketch_tests::Frozen::freeze(stack.gateways[coordinator].pid());
    let resumed_at = Instant::now() + Duration::from_secs(9);
    while Instant::now() < resumed_at {
        let codes = heartbeats(via, &group, &members, generation);
        assert!(
            codes.iter().all(|c| [0, 15, 16].contains(c)),
            "heartbeats during the pause: {codes:?}"
        );
        thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(heartbeats(via, &group, &members, generation), vec![0, 0, 0]);
    let logged = stack.gateways[coordinator].output().len();
    drop(paused);

    // Resumed, its own copy of the group is overdue: every member's session
    // has passed there. It must forget the copy (and write nothing of it),
    // not expire the members: the group goes on at its generation.
    await_log_after(&stack.gateways[coordinator], logged, "forgetting its groups");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        for g in &stack.gateways {
            let codes = heartbeats(g.kafka_addr(), &group, &members, generation);
            assert!(
                codes.iter().all(|c| [0, 15, 16].contains(c)),
                "heartbeats after the pause, through {}: {codes:?}",
                g.kafka_addr()
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
    let described = KafkaConn::connect(stack.lb.addr()).request(
        5,
        &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
    );
    assert_eq!(described.groups[0].group_state.as_str(), "Stable");
    assert_eq!(described.groups[0].members.len(), 3);
}

#[test]
fn a_parked_join_completes_when_the_last_member_joins_through_another_gateway_and_survives_its_coordinator() {
    // The first rebalance waits 2 s for more members: all three join it.
    let mut stack = stack_with(3, &["--set", "groups.initial_rebalance_delay=2s"]);
    let group = unique_topic("lb-handover");
    let (members, generation) = form_group(&stack, &group, 10_000);

    // Kill the coordinator; once the others see it gone, the group's new
    // coordinator takes it over from Redis: same generation, same members.
    let coordinator = coordinator_of(&stack, &group);
    let logged: Vec<usize> = stack.gateways.iter().map(|g| g.output().len()).collect();
    stack.gateways[coordinator].kill9();
    let survivor = (0..3).find(|i| *i != coordinator).expect("a survivor");
    let survivors: Vec<String> = (0..3)
        .filter(|i| *i != coordinator)
        .map(|i| i.to_string())
        .collect();
    let others = stack
        .gateways
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != coordinator);
    for (i, g) in others {
        await_log_after(g, logged[i], &format!("nodes=[{}]", survivors.join(", ")));
    }
    let via = stack.gateways[survivor].kafka_addr();
    let heartbeat = HeartbeatRequest::default()
        .with_group_id(GroupId(s(&group)))
        .with_generation_id(generation)
        .with_member_id(s(&members[0]));
    assert_eq!(
        KafkaConn::connect(via).request(4, &heartbeat).error_code,
        0,
        "a member of generation {generation} goes on with the new coordinator"
    );
    let described = KafkaConn::connect(via).request(
        5,
        &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
    );
    let described = &described.groups[0];
    assert_eq!(described.group_state.as_str(), "Stable");
    assert_eq!(described.members.len(), 3);

    // A commit from an older generation is refused; the current one commits.
    let topic = unique_topic("lb-handover-topic");
    assert_eq!(raw::create_topic(&mut KafkaConn::connect(via), &topic, 1), 0);
    let commit = |generation: i32| {
        let request = raw::offset_commit_request(&group, &members[0], generation, &topic, 0, 0);
        KafkaConn::connect(via).request(8, &request).topics[0].partitions[0].error_code
    };
    assert_eq!(commit(generation - 1), ILLEGAL_GENERATION);
    assert_eq!(commit(generation), 0);
    drop(stack.lb);
}

/// Which of the stack's gateways coordinates `group`: the one that logged
/// its rebalance.
fn coordinator_of(stack: &Stack, group: &str) -> usize {
    let needle = format!("group={group} generation=");
    let found: Vec<usize> = (0..stack.gateways.len())
        .filter(|i| {
            stack.gateways[*i]
                .output()
                .lines()
                .any(|l| l.contains("group stabilized") && l.contains(&needle))
        })
        .collect();
    assert_eq!(found.len(), 1, "one gateway stabilized {group}: {found:?}");
    found[0]
}

/// Waits for a log line containing `needle` written after the log's first
/// `from` bytes.
fn await_log_after(ketch: &Ketch, from: usize, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ketch.output()[from..].contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{}", ketch.output());
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn gateways_without_ids_claim_distinct_ones_and_a_taken_id_is_refused_or_awaited() {
    let redis = TestRedis::start();
    let url = redis.url();
    let fast = [
        "--set",
        "cluster.heartbeat_interval=100ms",
        "--set",
        "cluster.node_timeout=1500ms",
    ];
    // Three started at once get three ids.
    let starting: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            thread::spawn(move || Ketch::start(&url, &fast))
        })
        .collect();
    let mut gateways: Vec<Ketch> = starting.into_iter().map(|t| t.join().expect("start")).collect();
    let ids: BTreeSet<i32> = gateways.iter().map(node_id).collect();
    assert_eq!(ids, BTreeSet::from([0, 1, 2]), "three distinct ids");

    // A gateway killed and started again gets an id again; its old one is
    // still leased, so another.
    let old = node_id(&gateways[2]);
    gateways[2].kill9();
    gateways[2].restart();
    let new = node_id(&gateways[2]);
    let live: BTreeSet<i32> = gateways.iter().map(node_id).collect();
    assert_eq!(live.len(), 3, "restarted with a free id: {live:?} (was {old})");

    // A configured id a live gateway holds is a clear startup error.
    let taken = node_id(&gateways[0]).to_string();
    let mut args = vec!["--node-id", &taken];
    args.extend_from_slice(&fast);
    let output = Ketch::start_expecting_failure(&url, &args);
    assert!(
        output.contains("held by a live gateway"),
        "the error names the problem:\n{output}"
    );

    // A configured id whose holder crashed is waited for, not refused.
    let mut args = vec!["--node-id", "7"];
    args.extend_from_slice(&fast);
    let mut seven = Ketch::start(&url, &args);
    seven.kill9();
    seven.restart();
    assert_eq!(node_id(&seven), 7);
    assert!(
        seven.output().contains("waiting for its entry to expire"),
        "the restarted gateway said it waits:\n{}",
        seven.output()
    );
    let _ = new;
}

/// The node id a gateway registered under (from its log).
fn node_id(ketch: &Ketch) -> i32 {
    let output = ketch.output();
    let line = output
        .lines()
        .find(|l| l.contains("registered in ketch:brokers"))
        .unwrap_or_else(|| panic!("no registration line:\n{output}"));
    let id = line
        .split("node_id=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok());
    id.unwrap_or_else(|| panic!("no node id in {line:?}"))
}

#[test]
fn a_forwarded_request_survives_the_coordinator_closing_an_idle_forwarding_connection() {
    // Two gateways with their own addresses; the coordinator closes
    // connections idle for 1 s, the internal ones included.
    let redis = TestRedis::start();
    let args = [
        "--set",
        "cluster.heartbeat_interval=100ms",
        "--set",
        "cluster.node_timeout=1500ms",
        "--set",
        "broker.connections_max_idle=1s",
        // The internal listener's closings are logged at debug.
        "--set",
        "log.level=info,ketch_gateway::forward=debug",
    ];
    let gateways = [
        Ketch::start(&redis.url(), &args),
        Ketch::start(&redis.url(), &args),
    ];
    for g in &gateways {
        g.await_log("nodes=[0, 1]", Duration::from_secs(20));
    }
    // A group the second gateway coordinates, asked through the first.
    let group = (0..10_000)
        .map(|n| format!("idle-{n}"))
        .find(|g| {
            let found = KafkaConn::connect(gateways[0].kafka_addr())
                .request(3, &FindCoordinatorRequest::default().with_key(s(g)));
            // Gateways without a configured id are named by their address.
            found.port == i32::from(gateways[1].kafka_addr().port())
        })
        .expect("a group gateway 1 coordinates");
    let heartbeat = HeartbeatRequest::default()
        .with_group_id(GroupId(s(&group)))
        .with_generation_id(1)
        .with_member_id(s("nobody"));
    let via = gateways[0].kafka_addr();
    assert_eq!(
        KafkaConn::connect(via).request(4, &heartbeat).error_code,
        25,
        "forwarded: UNKNOWN_MEMBER_ID"
    );
    // Past the idle timeout the pooled connection is closed at the far end.
    gateways[1].await_log("idle for broker.connections_max_idle", Duration::from_secs(10));
    assert_eq!(
        KafkaConn::connect(via).request(4, &heartbeat).error_code,
        25,
        "forwarded again on a new connection, not COORDINATOR_NOT_AVAILABLE"
    );
}

/// Named listeners: each gateway has an EXTERNAL listener advertising one
/// shared address (a load balancer's) and an INTERNAL one of its own.
/// Metadata through EXTERNAL lists the shared address as one broker;
/// through INTERNAL, every gateway at its own address — on either gateway,
/// so each learns the other's listeners from the registry.
#[test]
fn each_listener_lists_the_gateways_by_its_own_addresses() {
    let redis = TestRedis::start();
    let [shared_port, external_1, internal_1, external_2, internal_2] = ketch_tests::free_ports();
    let ports = [(external_1, internal_1), (external_2, internal_2)];
    let gateways: Vec<Ketch> = ports
        .iter()
        .map(|(external, internal)| {
            // INTERNAL first: what a gateway says of itself without a
            // listener is not what EXTERNAL's clients are told.
            let listeners =
                format!("broker.listeners=INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{external}");
            let advertised = format!(
                "broker.advertised_listeners=INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{shared_port}"
            );
            Ketch::start(
                &redis.url(),
                &[
                    "--set",
                    &listeners,
                    "--set",
                    &advertised,
                    "--set",
                    "broker.listener_security_protocol_map=EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
                    "--set",
                    "cluster.heartbeat_interval=100ms",
                    "--set",
                    "cluster.node_timeout=1500ms",
                ],
            )
        })
        .collect();
    for g in &gateways {
        g.await_log("nodes=[0, 1]", Duration::from_secs(20));
    }
    let metadata = |port: u16| {
        let mut conn = KafkaConn::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        let response = conn.request(12, &MetadataRequest::default().with_topics(Some(Vec::new())));
        let mut brokers: Vec<(i32, i32)> = response.brokers.iter().map(|b| (b.node_id.0, b.port)).collect();
        brokers.sort_unstable();
        brokers
    };
    let internal_ports = {
        let mut p: Vec<i32> = ports.iter().map(|(_, i)| i32::from(*i)).collect();
        p.sort_unstable();
        p
    };
    for (external, internal) in &ports {
        let through_external = metadata(*external);
        assert_eq!(through_external.len(), 1, "{through_external:?}");
        assert!(through_external[0].0 > MAX_NODE_ID, "{through_external:?}");
        assert_eq!(through_external[0].1, i32::from(shared_port));
        let through_internal = metadata(*internal);
        let mut seen: Vec<i32> = through_internal.iter().map(|(_, port)| *port).collect();
        seen.sort_unstable();
        assert_eq!(seen, internal_ports, "{through_internal:?}");
        assert!(
            through_internal.iter().all(|(id, _)| *id <= MAX_NODE_ID),
            "{through_internal:?}"
        );
        // The broker's configs, by the node id each listener's clients
        // were given (kafka-configs.sh --entity-type brokers).
        for port in [*external, *internal] {
            let id = if port == *external {
                through_external[0].0
            } else {
                // This gateway's own entry among INTERNAL's.
                through_internal
                    .iter()
                    .find(|(_, p)| *p == i32::from(*internal))
                    .expect("this gateway among INTERNAL's brokers")
                    .0
            };
            let mut conn = KafkaConn::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
            let response = conn.request(
                4,
                &kafka_protocol::messages::DescribeConfigsRequest::default().with_resources(vec![
                    kafka_protocol::messages::describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(4)
                        .with_resource_name(kafka_protocol::protocol::StrBytes::from_string(id.to_string()))
                        .with_configuration_keys(Some(vec![
                            kafka_protocol::protocol::StrBytes::from_static_str("broker.id"),
                        ])),
                ]),
            );
            let result = &response.results[0];
            assert_eq!(
                result.error_code, 0,
                "port {port}, id {id}: {:?}",
                result.error_message
            );
            assert_eq!(
                result.configs[0].value.as_deref(),
                Some(id.to_string().as_str()),
                "port {port}"
            );
        }
    }
}

/// ListGroups and ListTransactions through an address several gateways
/// share list the groups and transactional ids of each of them, and none
/// of a gateway the listener advertises at an address of its own: an admin
/// client asks every broker Metadata lists, that one too, and would see
/// them twice.
#[test]
fn listings_through_a_shared_address_leave_out_gateways_of_their_own() {
    let redis = TestRedis::start();
    let shared_port = ketch_tests::free_port().to_string();
    let start = |shared: bool| {
        let mut args = vec![
            "--set",
            "cluster.heartbeat_interval=100ms",
            "--set",
            "cluster.node_timeout=1500ms",
        ];
        if shared {
            args.extend(["--advertised-port", &shared_port]);
        }
        Ketch::start(&redis.url(), &args)
    };
    let gateways = [start(true), start(true), start(false)];
    for g in &gateways {
        g.await_log("nodes=[0, 1, 2]", Duration::from_secs(20));
    }
    // Groups known by their committed offsets, and idle transactional ids
    // as a finished transaction leaves them, spread over the three
    // coordinators by their ids (one command per key: the suite runs on a
    // Redis Cluster too).
    let all: BTreeSet<String> = (0..30).map(|i| unique_topic(&format!("listed-{i}"))).collect();
    let mut conn = redis.connection();
    for (n, id) in all.iter().enumerate() {
        let () = redis::cmd("SADD")
            .arg("ketch:groups")
            .arg(id)
            .query(&mut conn)
            .unwrap();
        let () = redis::cmd("HSET")
            .arg(format!("ketch:group:{{{id}}}:offsets"))
            .arg("t:0")
            .arg(r#"{"offset":1,"leader_epoch":-1,"metadata":null,"commit_ms":0}"#)
            .query(&mut conn)
            .unwrap();
        let () = redis::cmd("HSET")
            .arg(format!("ketch:txn:{{{id}}}"))
            .arg(
                &[
                    "pid",
                    &n.to_string(),
                    "epoch",
                    "0",
                    "state",
                    "Empty",
                    "timeout_ms",
                    "60000",
                ][..],
            )
            .query(&mut conn)
            .unwrap();
        let () = redis::cmd("ZADD")
            .arg("ketch:transactions")
            .arg(9.0e15)
            .arg(id)
            .query(&mut conn)
            .unwrap();
    }
    let groups = |ketch: &Ketch| -> BTreeSet<String> {
        let response = KafkaConn::connect(ketch.kafka_addr())
            .request(4, &kafka_protocol::messages::ListGroupsRequest::default());
        assert_eq!(response.error_code, 0);
        response.groups.iter().map(|g| g.group_id.to_string()).collect()
    };
    let transactions = |ketch: &Ketch| -> BTreeSet<String> {
        let response = KafkaConn::connect(ketch.kafka_addr())
            .request(0, &kafka_protocol::messages::ListTransactionsRequest::default());
        assert_eq!(response.error_code, 0);
        (response.transaction_states.iter())
            .map(|t| t.transactional_id.to_string())
            .collect()
    };
    for list in [groups, transactions] {
        let (shared, shared_again, own) = (list(&gateways[0]), list(&gateways[1]), list(&gateways[2]));
        assert_eq!(
            shared, shared_again,
            "either gateway behind the address lists the same"
        );
        assert!(!own.is_empty(), "the gateway of its own coordinates none of 30");
        assert!(
            shared.is_disjoint(&own),
            "listed twice: {:?}",
            shared.intersection(&own).collect::<Vec<_>>()
        );
        assert_eq!(&shared | &own, all);
    }
}

/// The admin API's list of groups, asked of a gateway behind a shared
/// address while another one there does not answer (paused), lists what it
/// can instead of failing as a whole, and names the gateway it left out
/// (the list is partial: a reader must not take it as complete).
#[test]
fn the_admin_apis_group_list_leaves_out_a_gateway_that_does_not_answer() {
    let redis = TestRedis::start();
    let shared_port = ketch_tests::free_port().to_string();
    let start = || {
        Ketch::start(
            &redis.url(),
            &[
                "--set",
                "cluster.heartbeat_interval=100ms",
                "--set",
                "cluster.node_timeout=1500ms",
                "--advertised-port",
                &shared_port,
            ],
        )
    };
    let gateways = [start(), start()];
    for g in &gateways {
        g.await_log("nodes=[0, 1]", Duration::from_secs(20));
    }
    let (status, body) = gateways[0].http_get("/api/v1/groups");
    assert_eq!(status, 200, "{body}");
    let complete: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(complete["unanswered_gateways"], serde_json::json!([]), "{body}");
    let _paused = ketch_tests::Frozen::freeze(gateways[1].pid());
    let (status, body) = gateways[0].http_get("/api/v1/groups");
    assert_eq!(status, 200, "{body}");
    let partial: serde_json::Value = serde_json::from_str(&body).unwrap();
    let left_out = partial["unanswered_gateways"].as_array().expect("a list");
    assert_eq!(left_out.len(), 1, "{body}");
    assert!(left_out[0]["error"].is_string(), "{body}");
}

/// An answer relayed from the coordinator is read whatever its size, as a
/// client reads answers: `broker.max_request_bytes` bounds requests, and a
/// DescribeGroups answer holds every member's metadata and assignment.
/// Held to that bound (4 KiB here), it was COORDINATOR_NOT_AVAILABLE
/// through every gateway but the coordinator, for ever.
#[test]
fn an_answer_larger_than_any_request_is_relayed_from_the_coordinator() {
    let stack = stack_with(
        2,
        &[
            "--set",
            "broker.max_request_bytes=4096",
            "--set",
            "groups.initial_rebalance_delay=0ms",
        ],
    );
    let group = unique_topic("lb-large-answer");
    let metadata = bytes::Bytes::from(vec![b'm'; 3000]);
    let assignment = bytes::Bytes::from(vec![b'a'; 3000]);
    let mut conn = KafkaConn::connect(stack.gateways[0].kafka_addr());
    let member = member_id(&mut conn, &group);
    let joined: JoinGroupResponse = conn.request(
        7,
        &JoinGroupRequest::default()
            .with_group_id(GroupId(s(&group)))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(&member))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(s("range"))
                    .with_metadata(metadata.clone()),
            ]),
    );
    assert_eq!((joined.error_code, joined.leader.as_str()), (0, member.as_str()));
    let synced = conn.request(
        3,
        &SyncGroupRequest::default()
            .with_group_id(GroupId(s(&group)))
            .with_generation_id(joined.generation_id)
            .with_member_id(s(&member))
            .with_assignments(vec![
                SyncGroupRequestAssignment::default()
                    .with_member_id(s(&member))
                    .with_assignment(assignment.clone()),
            ]),
    );
    assert_eq!(synced.error_code, 0);
    for gateway in &stack.gateways {
        let described = KafkaConn::connect(gateway.kafka_addr()).request(
            3,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
        );
        let described = &described.groups[0];
        assert_eq!(described.error_code, 0, "through {}", gateway.kafka_addr());
        assert_eq!(
            (
                &described.members[0].member_metadata,
                &described.members[0].member_assignment
            ),
            (&metadata, &assignment)
        );
    }
}

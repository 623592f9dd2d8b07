//! Committed offsets in Redis: OffsetCommit, OffsetFetch and OffsetDelete
//! for a group without members (consumers that assign their own partitions),
//! and OffsetDelete for a group with members, through the raw protocol so
//! every error code is visible.

use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolSubscription, GroupId, JoinGroupRequest, JoinGroupResponse, OffsetCommitRequest,
    OffsetDeleteRequest, OffsetFetchRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};

const OFFSET_METADATA_TOO_LARGE: i16 = 12;
const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const GROUP_ID_NOT_FOUND: i16 = 69;
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;

fn commit(
    conn: &mut KafkaConn,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64, &str)],
    generation: i32,
) -> Vec<i16> {
    commit_as(conn, group, "", topic, offsets, generation)
}

/// [`commit`] by the group's member `member_id`.
fn commit_as(
    conn: &mut KafkaConn,
    group: &str,
    member_id: &str,
    topic: &str,
    offsets: &[(i32, i64, &str)],
    generation: i32,
) -> Vec<i16> {
    let request = OffsetCommitRequest::default()
        .with_group_id(StrBytes::from_string(group.to_owned()).into())
        .with_member_id(StrBytes::from_string(member_id.to_owned()))
        .with_generation_id_or_member_epoch(generation)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(raw::topic_name(topic))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|(p, offset, metadata)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(*offset)
                                .with_committed_leader_epoch(0)
                                .with_committed_metadata(Some(StrBytes::from_string((*metadata).to_owned())))
                        })
                        .collect(),
                ),
        ]);
    let response = conn.request(8, &request);
    response.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

/// (partition, offset, metadata) committed for `partitions`.
fn fetch(conn: &mut KafkaConn, group: &str, topic: &str, partitions: &[i32]) -> Vec<(i32, i64, String)> {
    let request = OffsetFetchRequest::default()
        .with_group_id(StrBytes::from_string(group.to_owned()).into())
        .with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(raw::topic_name(topic))
                .with_partition_indexes(partitions.to_vec()),
        ]));
    let response = conn.request(7, &request);
    assert_eq!(response.error_code, code::NONE);
    response.topics[0]
        .partitions
        .iter()
        .map(|p| {
            let metadata = p.metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
            (p.partition_index, p.committed_offset, metadata)
        })
        .collect()
}

#[test]
fn offsets_of_a_group_without_members_commit_fetch_and_delete() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "groups.max_metadata_bytes=16",
            "--set",
            "groups.offsets_retention=1h",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("offsets");
    assert_eq!(raw::create_topic(&mut conn, &topic, 3), code::NONE);
    let group = unique_topic("group");

    // The limit counts Java characters, as Kafka does: 16 of them in 32
    // bytes fit.
    let accented = "é".repeat(16);
    let codes = commit(
        &mut conn,
        &group,
        &topic,
        &[
            (0, 10, "a"),
            (1, 20, &accented),
            (7, 5, ""),
            (2, 1, &"x".repeat(17)),
        ],
        -1,
    );
    assert_eq!(
        codes,
        vec![0, 0, code::UNKNOWN_TOPIC_OR_PARTITION, OFFSET_METADATA_TOO_LARGE]
    );
    assert_eq!(
        fetch(&mut conn, &group, &topic, &[0, 1, 2]),
        vec![
            (0, 10, "a".to_owned()),
            (1, 20, accented.clone()),
            (2, -1, String::new())
        ]
    );
    // A group without members keeps its offsets for the retention from the commit.
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("ketch:group:{{{group}}}:offsets"))
        .query(&mut redis.connection())
        .unwrap();
    assert!((3_500_000..=3_600_000).contains(&ttl), "offsets TTL {ttl} ms");
    // A generation for a group that has none: its member is unknown (the
    // group exists, Empty, for Kafka).
    assert_eq!(
        commit(&mut conn, &group, &topic, &[(0, 11, "")], 3),
        vec![UNKNOWN_MEMBER_ID]
    );
    assert_eq!(fetch(&mut conn, &group, &topic, &[0])[0].1, 10);

    let delete = OffsetDeleteRequest::default()
        .with_group_id(StrBytes::from_string(group.clone()).into())
        .with_topics(vec![
            OffsetDeleteRequestTopic::default()
                .with_name(raw::topic_name(&topic))
                .with_partitions(vec![
                    OffsetDeleteRequestPartition::default().with_partition_index(0),
                ]),
        ]);
    let response = conn.request(0, &delete);
    assert_eq!(response.error_code, code::NONE);
    assert_eq!(fetch(&mut conn, &group, &topic, &[0, 1])[0].1, -1);
    assert_eq!(fetch(&mut conn, &group, &topic, &[0, 1])[1].1, 20);
    // A missing partition, or topic, is UNKNOWN_TOPIC_OR_PARTITION, and
    // the partition beside it is deleted.
    let missing = delete.clone().with_topics(vec![
        OffsetDeleteRequestTopic::default()
            .with_name(raw::topic_name(&topic))
            .with_partitions(vec![
                OffsetDeleteRequestPartition::default().with_partition_index(1),
                OffsetDeleteRequestPartition::default().with_partition_index(99),
            ]),
        OffsetDeleteRequestTopic::default()
            .with_name(raw::topic_name(&unique_topic("no-such-topic")))
            .with_partitions(vec![
                OffsetDeleteRequestPartition::default().with_partition_index(0),
            ]),
    ]);
    let response = conn.request(0, &missing);
    assert_eq!(response.error_code, code::NONE);
    let codes: Vec<Vec<i16>> = response
        .topics
        .iter()
        .map(|t| t.partitions.iter().map(|p| p.error_code).collect())
        .collect();
    assert_eq!(
        codes,
        vec![
            vec![code::NONE, code::UNKNOWN_TOPIC_OR_PARTITION],
            vec![code::UNKNOWN_TOPIC_OR_PARTITION]
        ]
    );
    assert_eq!(fetch(&mut conn, &group, &topic, &[1])[0].1, -1);
    // Committed again for what follows.
    assert_eq!(commit(&mut conn, &group, &topic, &[(1, 20, "")], -1), vec![0]);

    let unknown = delete
        .clone()
        .with_group_id(StrBytes::from_static_str("no-such-group").into());
    assert_eq!(conn.request(0, &unknown).error_code, GROUP_ID_NOT_FOUND);
    let empty = delete.with_group_id(StrBytes::from_static_str("").into());
    assert_eq!(conn.request(0, &empty).error_code, 24, "INVALID_GROUP_ID");

    // Offsets live in Redis: a restarted gateway still has them.
    drop(conn);
    drop(ketch);
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(fetch(&mut conn, &group, &topic, &[1])[0].1, 20);
}

/// A JoinGroup v3 (no member id round trip) of a member subscribed to
/// `topics` with the consumer protocol (or of `protocol_type`'s members).
fn join(
    conn: &mut KafkaConn,
    group: &str,
    member_id: &str,
    protocol_type: &str,
    topics: &[&str],
) -> JoinGroupResponse {
    let mut metadata = bytes::BytesMut::new();
    metadata.extend_from_slice(&0i16.to_be_bytes());
    ConsumerProtocolSubscription::default()
        .with_topics(
            topics
                .iter()
                .map(|t| StrBytes::from_string((*t).to_owned()))
                .collect(),
        )
        .encode(&mut metadata, 0)
        .unwrap();
    let request = JoinGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(StrBytes::from_string(member_id.to_owned()))
        .with_protocol_type(StrBytes::from_string(protocol_type.to_owned()))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(metadata.freeze()),
        ]);
    conn.request(3, &request)
}

/// One member subscribed to `topic` joins `group` (the consumer protocol):
/// its member id, its generation, and the SyncGroup that makes the group
/// Stable (as the leader, assigning itself).
fn join_and_sync_request(
    conn: &mut KafkaConn,
    group: &str,
    topic: &str,
) -> (StrBytes, i32, SyncGroupRequest) {
    let joined = join(conn, group, "", "consumer", &[topic]);
    assert_eq!(joined.error_code, code::NONE);
    let (member, generation) = (joined.member_id.clone(), joined.generation_id);
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
        .with_member_id(member.clone())
        .with_generation_id(generation)
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(member.clone())
                .with_assignment(bytes::Bytes::from_static(b"assignment")),
        ]);
    (member, generation, sync)
}

/// A topic of one partition (named from `prefix`), and a group (too) of one
/// member subscribed to it, Stable, that committed offset 7 there: (topic,
/// group, member id).
fn stable_group_at_7(conn: &mut KafkaConn, prefix: &str) -> (String, String, StrBytes) {
    let topic = unique_topic(prefix);
    assert_eq!(raw::create_topic(conn, &topic, 1), code::NONE);
    let group = unique_topic(&format!("{prefix}-group"));
    let (member, generation, sync) = join_and_sync_request(conn, &group, &topic);
    assert_eq!(conn.request(3, &sync).error_code, code::NONE);
    assert_eq!(
        commit_as(conn, &group, &member, &topic, &[(0, 7, "")], generation),
        vec![0]
    );
    (topic, group, member)
}

/// OffsetDelete of partition 0 of each topic: the request's error and each
/// topic's.
fn delete_offsets(conn: &mut KafkaConn, group: &str, topics: &[&str]) -> (i16, Vec<i16>) {
    let request = OffsetDeleteRequest::default()
        .with_group_id(StrBytes::from_string(group.to_owned()).into())
        .with_topics(
            topics
                .iter()
                .map(|topic| {
                    OffsetDeleteRequestTopic::default()
                        .with_name(raw::topic_name(topic))
                        .with_partitions(vec![
                            OffsetDeleteRequestPartition::default().with_partition_index(0),
                        ])
                })
                .collect(),
        );
    let response = conn.request(0, &request);
    let codes = response
        .topics
        .iter()
        .map(|t| t.partitions[0].error_code)
        .collect();
    (response.error_code, codes)
}

#[test]
fn offsets_of_topics_a_group_consumes_stay_during_a_rebalance() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "groups.initial_rebalance_delay=0s"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (consumed, other) = (unique_topic("consumed"), unique_topic("other"));
    for topic in [&consumed, &other] {
        assert_eq!(raw::create_topic(&mut conn, topic, 1), code::NONE);
    }
    let group = unique_topic("group");

    // One member, subscribed to `consumed`, joins and syncs: Stable.
    let (member, generation, sync) = join_and_sync_request(&mut conn, &group, &consumed);
    // From v5 the protocol type and name are mandatory.
    const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    assert_eq!(conn.request(5, &sync).error_code, INCONSISTENT_GROUP_PROTOCOL);
    assert_eq!(conn.request(2, &sync).error_code, code::NONE);
    for topic in [&consumed, &other] {
        let committed = commit_as(&mut conn, &group, &member, topic, &[(0, 7, "")], generation);
        assert_eq!(committed, vec![0]);
    }

    // A second member's join, subscribed to the other topic, starts a
    // rebalance (it waits for the first to rejoin): the group describes no
    // subscriptions in this state, and what stays is what the generation's
    // members subscribed to when it began, as in Kafka (`other` is not,
    // though a member that joined since subscribes to it).
    let addr = ketch.kafka_addr();
    let (group2, other2) = (group.clone(), other.clone());
    let second = std::thread::spawn(move || {
        let mut conn = KafkaConn::connect(addr);
        join(&mut conn, &group2, "", "consumer", &[&other2]).error_code
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let heartbeat = kafka_protocol::messages::HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.clone())))
            .with_member_id(member.clone())
            .with_generation_id(generation);
        if conn.request(3, &heartbeat).error_code == 27 {
            break; // REBALANCE_IN_PROGRESS
        }
        assert!(std::time::Instant::now() < deadline, "no rebalance began");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        delete_offsets(&mut conn, &group, &[&consumed, &other]),
        (code::NONE, vec![GROUP_SUBSCRIBED_TO_TOPIC, code::NONE])
    );
    assert_eq!(fetch(&mut conn, &group, &consumed, &[0])[0].1, 7, "kept");
    assert_eq!(fetch(&mut conn, &group, &other, &[0])[0].1, -1, "deleted");

    // The first member rejoins: the rebalance completes for both.
    assert_eq!(
        join(&mut conn, &group, &member, "consumer", &[&consumed]).error_code,
        code::NONE
    );
    assert_eq!(second.join().unwrap(), code::NONE);
    // The new generation subscribes to both.
    assert_eq!(
        delete_offsets(&mut conn, &group, &[&consumed, &other]),
        (
            code::NONE,
            vec![GROUP_SUBSCRIBED_TO_TOPIC, GROUP_SUBSCRIBED_TO_TOPIC]
        )
    );

    // A group whose members do not use the consumer protocol keeps its
    // offsets while it has members.
    let connect = unique_topic("connect-group");
    assert_eq!(
        join(&mut conn, &connect, "", "connect", &[]).error_code,
        code::NONE
    );
    assert_eq!(delete_offsets(&mut conn, &connect, &[&other]).0, NON_EMPTY_GROUP);

    // A group that exists without offsets (its one member left: Empty) is
    // not GROUP_ID_NOT_FOUND, as in Kafka: there is just nothing to delete.
    let lonely = unique_topic("lonely-group");
    let joined = join(&mut conn, &lonely, "", "consumer", &[&other]);
    assert_eq!(joined.error_code, code::NONE);
    let leave = kafka_protocol::messages::LeaveGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(lonely.clone())))
        .with_member_id(joined.member_id.clone());
    assert_eq!(conn.request(1, &leave).error_code, code::NONE);
    assert_eq!(
        delete_offsets(&mut conn, &lonely, &[&other]),
        (code::NONE, vec![code::NONE])
    );
}

/// A group brought in from an Empty snapshot expires after the retention
/// even when its keys were kept: its coordinator kept them as a member
/// joined again and went (with that member) before the group was Stable,
/// so its snapshot is the Empty one, and nothing else would let them go.
#[test]
fn a_group_found_empty_expires_though_its_last_coordinator_kept_it() {
    let redis = TestRedis::start();
    let settings = [
        "--set",
        "groups.initial_rebalance_delay=0s",
        "--set",
        "groups.offsets_retention=1h",
    ];
    let mut first = Ketch::start(&redis.url(), &settings);
    let mut conn = KafkaConn::connect(first.kafka_addr());
    let (topic, group, member) = stable_group_at_7(&mut conn, "found-empty");
    let leave = kafka_protocol::messages::LeaveGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.clone())))
        .with_member_id(member.clone());
    assert_eq!(conn.request(1, &leave).error_code, code::NONE);
    let keys = ["offsets", "state"].map(|k| format!("ketch:group:{{{group}}}:{k}"));
    let pttl = |key: &str| -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query(&mut redis.connection())
            .expect("PTTL")
    };
    let eventually_expiring = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while keys.iter().any(|key| pttl(key) <= 0) {
            assert!(
                std::time::Instant::now() < deadline,
                "the group's keys do not expire: {:?}",
                keys.iter().map(|key| pttl(key)).collect::<Vec<_>>()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    eventually_expiring();
    // What a coordinator that saw a member join again leaves, had it gone
    // before the group was Stable again.
    for key in &keys {
        let _: i64 = redis::cmd("PERSIST")
            .arg(key)
            .query(&mut redis.connection())
            .expect("PERSIST");
    }
    first.kill9();
    let second = Ketch::start(&redis.url(), &settings);
    let mut conn = KafkaConn::connect(second.kafka_addr());
    let describe = kafka_protocol::messages::DescribeGroupsRequest::default()
        .with_groups(vec![GroupId(StrBytes::from_string(group.clone()))]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let described: kafka_protocol::messages::DescribeGroupsResponse = conn.request(5, &describe);
        let described = &described.groups[0];
        if described.error_code == code::NONE {
            assert_eq!(described.group_state.as_str(), "Empty");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "DescribeGroups: {}",
            described.error_code
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eventually_expiring();
    assert!(
        keys.iter().all(|key| pttl(key) > 3_500_000),
        "the retention counts from now"
    );
    assert_eq!(fetch(&mut conn, &group, &topic, &[0])[0].1, 7, "kept meanwhile");
}

/// A Stable group whose offsets Redis was left to expire (the write that
/// kept them lost to a failover: it is not waited for by replicas) keeps
/// them again at its coordinator's next look.
#[test]
fn a_stable_groups_lost_retention_is_written_again() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "groups.initial_rebalance_delay=0s",
            "--set",
            "groups.offsets_retention_check_interval=100ms",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (_, group, _) = stable_group_at_7(&mut conn, "lost-retention");
    let key = format!("ketch:group:{{{group}}}:offsets");
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(600_000)
        .query(&mut redis.connection())
        .expect("PEXPIRE");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut redis.connection())
            .expect("PTTL");
        if ttl == -1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a Stable group's offsets still expire in {ttl} ms"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The list of groups with a snapshot (`ketch:groups:snapshots`, read by a
/// gateway that takes groups over) forgets a group whose snapshot expired
/// at the next offsets-retention look, and keeps a live one: it was pruned
/// only when the gateways' membership changed.
#[test]
fn the_list_of_groups_with_a_snapshot_forgets_expired_ones() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "groups.initial_rebalance_delay=0s",
            "--set",
            "groups.offsets_retention_check_interval=100ms",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (_, live, _) = stable_group_at_7(&mut conn, "snapshot-listed");
    let gone = unique_topic("snapshot-expired");
    let listed = |group: &str| -> bool {
        redis::cmd("SISMEMBER")
            .arg("ketch:groups:snapshots")
            .arg(group)
            .query(&mut redis.connection())
            .expect("SISMEMBER")
    };
    // A group whose snapshot expired with its retention: listed, no state.
    let _: i64 = redis::cmd("SADD")
        .arg("ketch:groups:snapshots")
        .arg(&gone)
        .query(&mut redis.connection())
        .expect("SADD");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while listed(&gone) {
        assert!(std::time::Instant::now() < deadline, "still listed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(listed(&live), "the live group stays listed");
}

/// Redis refusing writes (out of memory here) makes a commit
/// COORDINATOR_NOT_AVAILABLE, which consumers retry after looking the
/// coordinator up again, as Kafka's coordinator answers a failed write:
/// KAFKA_STORAGE_ERROR, answered before, is fatal to the Java consumer's
/// commit. Nothing is half-written, and commits work once Redis takes
/// writes again.
#[test]
fn a_commit_redis_refuses_is_coordinator_not_available() {
    const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("offsets-refused");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let offsets = |first: i64| [(0, first, ""), (1, first + 1, "")];
    assert_eq!(commit(&mut conn, "refused", &topic, &offsets(5), -1), [0, 0]);
    redis.config_set("maxmemory", "1");
    let refused = commit(&mut conn, "refused", &topic, &offsets(7), -1);
    redis.config_set("maxmemory", "0");
    assert_eq!(refused, [COORDINATOR_NOT_AVAILABLE; 2]);
    let stored = |conn: &mut KafkaConn| {
        fetch(conn, "refused", &topic, &[0, 1])
            .into_iter()
            .map(|(_, offset, _)| offset)
            .collect::<Vec<_>>()
    };
    assert_eq!(stored(&mut conn), [5, 6], "the refused commit changed nothing");
    assert_eq!(commit(&mut conn, "refused", &topic, &offsets(7), -1), [0, 0]);
    assert_eq!(stored(&mut conn), [7, 8]);
}

/// OffsetCommit with a generation, for a group without members: one that
/// has offsets exists for Kafka (Empty), so its member is unknown
/// (UNKNOWN_MEMBER_ID, which a consumer handles by rejoining), at every
/// version; one without offsets is GROUP_ID_NOT_FOUND from v9,
/// ILLEGAL_GENERATION before.
#[test]
fn a_generation_committed_to_a_group_without_members_is_told_what_kafka_tells() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("offsets-v9");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (standalone, unknown) = (unique_topic("standalone"), unique_topic("nobody"));
    assert_eq!(commit(&mut conn, &standalone, &topic, &[(0, 5, "")], -1), vec![0]);
    let to = |conn: &mut KafkaConn, version: i16, group: &str, topic: &str, partition: i32| {
        let request = OffsetCommitRequest::default()
            .with_group_id(StrBytes::from_string(group.to_owned()).into())
            .with_member_id(StrBytes::from_static_str("member-1"))
            .with_generation_id_or_member_epoch(3)
            .with_topics(vec![
                OffsetCommitRequestTopic::default()
                    .with_name(raw::topic_name(topic))
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(partition)
                            .with_committed_offset(9),
                    ]),
            ]);
        let response = conn.request(version, &request);
        response.topics[0].partitions[0].error_code
    };
    let at = |conn: &mut KafkaConn, version: i16, group: &str| to(conn, version, group, &topic, 0);
    assert_eq!(at(&mut conn, 9, &standalone), UNKNOWN_MEMBER_ID);
    assert_eq!(at(&mut conn, 8, &standalone), UNKNOWN_MEMBER_ID);
    assert_eq!(at(&mut conn, 9, &unknown), GROUP_ID_NOT_FOUND);
    assert_eq!(at(&mut conn, 8, &unknown), ILLEGAL_GENERATION);
    // A topic or partition that does not exist is told so first, as Kafka
    // checks them before the request reaches the coordinator (the Java
    // consumer retries UNKNOWN_TOPIC_OR_PARTITION; UNKNOWN_MEMBER_ID makes
    // it rejoin).
    let missing = unique_topic("no-such-topic");
    assert_eq!(
        to(&mut conn, 9, &standalone, &missing, 0),
        code::UNKNOWN_TOPIC_OR_PARTITION
    );
    assert_eq!(
        to(&mut conn, 9, &unknown, &topic, 5),
        code::UNKNOWN_TOPIC_OR_PARTITION
    );
    assert_eq!(
        fetch(&mut conn, &standalone, &topic, &[0])[0].1,
        5,
        "nothing committed"
    );
}

/// Deleting a topic removes its offsets from every group, committed and
/// staged by a transaction, as Kafka's coordinator writes their tombstones:
/// a topic created again under the name starts each group at its reset
/// policy, not at the old topic's offsets. Other topics' offsets stay.
#[test]
fn deleting_a_topic_drops_its_offsets_from_every_group() {
    use kafka_protocol::messages::DeleteTopicsRequest;
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (topic, other) = (unique_topic("deleted"), unique_topic("kept"));
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    assert_eq!(raw::create_topic(&mut conn, &other, 1), code::NONE);
    let (first, second) = (unique_topic("group-a"), unique_topic("group-b"));
    assert_eq!(
        commit(&mut conn, &first, &topic, &[(0, 5, ""), (1, 7, "")], -1),
        [0, 0]
    );
    assert_eq!(commit(&mut conn, &first, &other, &[(0, 3, "")], -1), [0]);
    assert_eq!(commit(&mut conn, &second, &topic, &[(0, 9, "")], -1), [0]);
    // Offsets staged by an open transaction (`<topic>:<partition>:<pid>`).
    let staged = format!("ketch:group:{{{first}}}:txn-offsets");
    for field in [format!("{topic}:1:42"), format!("{other}:0:42")] {
        let _: () = redis::cmd("HSET")
            .arg(&staged)
            .arg(field)
            .arg("1:3:txn{\"offset\":1}")
            .query(&mut redis.connection())
            .unwrap();
    }

    let delete = DeleteTopicsRequest::default()
        .with_topics(vec![
            DeleteTopicState::default().with_name(Some(raw::topic_name(&topic))),
        ])
        .with_timeout_ms(10_000);
    let deleted: kafka_protocol::messages::DeleteTopicsResponse = conn.request(6, &delete);
    assert_eq!(deleted.responses[0].error_code, code::NONE);
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let offsets = |conn: &mut KafkaConn, group: &str, topic: &str, partitions: &[i32]| -> Vec<i64> {
        fetch(conn, group, topic, partitions)
            .into_iter()
            .map(|(_, o, _)| o)
            .collect()
    };
    assert_eq!(offsets(&mut conn, &first, &topic, &[0, 1]), [-1, -1]);
    assert_eq!(offsets(&mut conn, &second, &topic, &[0]), [-1]);
    assert_eq!(
        offsets(&mut conn, &first, &other, &[0]),
        [3],
        "another topic's offset stays"
    );
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg(&staged)
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(left, [format!("{other}:0:42")]);

    // A commit a gateway accepted from its copy of the deleted topic, and
    // wrote after the deletion dropped the offsets, names the deleted
    // topic's id: not an offset of the topic created again. One an older
    // release wrote names none, and counts.
    let offsets_key = format!("ketch:group:{{{second}}}:offsets");
    let stale = format!(
        r#"{{"offset":42,"leader_epoch":-1,"metadata":null,"commit_ms":0,"topic_id":"{}"}}"#,
        uuid::Uuid::new_v4()
    );
    let older = r#"{"offset":43,"leader_epoch":-1,"metadata":null,"commit_ms":0}"#;
    let _: () = redis::cmd("HSET")
        .arg(&offsets_key)
        .arg(format!("{topic}:0"))
        .arg(&stale)
        .arg(format!("{topic}:1"))
        .arg(older)
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(offsets(&mut conn, &second, &topic, &[0, 1]), [-1, 43]);
    let all: kafka_protocol::messages::OffsetFetchResponse = conn.request(
        7,
        &kafka_protocol::messages::OffsetFetchRequest::default()
            .with_group_id(StrBytes::from_string(second.clone()).into())
            .with_topics(None),
    );
    let listed: Vec<(i32, i64)> = all
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition_index, p.committed_offset))
        })
        .collect();
    assert_eq!(
        listed,
        [(1, 43)],
        "the deleted incarnation's offset is not listed"
    );
    // The topic's own commit replaces it.
    assert_eq!(commit(&mut conn, &second, &topic, &[(0, 1, "")], -1), [0]);
    assert_eq!(offsets(&mut conn, &second, &topic, &[0, 1]), [1, 43]);
}

/// DeleteGroups answers a group named twice once, as Kafka (which takes
/// each name once); DescribeGroups reports authorised operations only with
/// a group described, not with an error.
#[test]
fn delete_groups_answers_each_name_once_and_errors_carry_no_operations() {
    use kafka_protocol::messages::{DeleteGroupsRequest, DescribeGroupsRequest};
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("delete-groups");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (group, unknown) = (unique_topic("group"), unique_topic("unknown"));
    assert_eq!(commit(&mut conn, &group, &topic, &[(0, 5, "")], -1), [0]);

    let described = conn.request(
        6,
        &DescribeGroupsRequest::default()
            .with_groups(vec![
                GroupId(StrBytes::from_string(group.clone())),
                GroupId(StrBytes::from_string(unknown.clone())),
            ])
            .with_include_authorized_operations(true),
    );
    let answers: Vec<(i16, bool)> = described
        .groups
        .iter()
        .map(|g| (g.error_code, g.authorized_operations != i32::MIN))
        .collect();
    assert_eq!(answers, [(code::NONE, true), (GROUP_ID_NOT_FOUND, false)]);

    let name = |g: &str| GroupId(StrBytes::from_string(g.to_owned()));
    let deleted = conn.request(
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![name(&group), name(&group), name(&unknown)]),
    );
    let results: Vec<(String, i16)> = deleted
        .results
        .iter()
        .map(|r| (r.group_id.to_string(), r.error_code))
        .collect();
    assert_eq!(
        results,
        [(group.clone(), code::NONE), (unknown, GROUP_ID_NOT_FOUND)]
    );
    assert_eq!(fetch(&mut conn, &group, &topic, &[0])[0].1, -1);
}

/// A gateway that expires offsets `retention` after their commit (or
/// their group emptying), looking every 100 ms.
fn expiring_gateway(redis: &TestRedis, retention: &str) -> Ketch {
    Ketch::start(
        &redis.url(),
        &[
            "--set",
            "groups.initial_rebalance_delay=0s",
            "--set",
            &format!("groups.offsets_retention={retention}"),
            "--set",
            "groups.offsets_retention_check_interval=100ms",
        ],
    )
}

/// Offsets no member consumes expire one by one, `groups.offsets_retention`
/// after their commit, as Kafka's coordinator expires them: every offset of
/// a group no member ever joined (each on its own, however recently others
/// were committed), and those of topics a stable consumer group's members
/// do not subscribe to (theirs stay, however old).
#[test]
fn offsets_no_member_consumes_expire_one_by_one() {
    let redis = TestRedis::start();
    let ketch = expiring_gateway(&redis, "2s");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (consumed, other) = (unique_topic("consumed"), unique_topic("other"));
    for topic in [&consumed, &other] {
        assert_eq!(raw::create_topic(&mut conn, topic, 2), code::NONE);
    }
    // A group without members commits a partition for which an open
    // transaction has staged an offset (as TxnOffsetCommit stages it:
    // `<topic>:<partition>:<producer id>`), then two more (later: when
    // those expire, the first is as old as they are).
    let standalone = unique_topic("standalone");
    assert_eq!(
        commit(&mut conn, &standalone, &consumed, &[(0, 4, "")], -1),
        vec![0]
    );
    let staged_key = format!("ketch:group:{{{standalone}}}:txn-offsets");
    let staged_field = format!("{consumed}:0:1000");
    let () = redis::cmd("HSET")
        .arg(&staged_key)
        .arg(&staged_field)
        .arg("1:3:txn{\"offset\":9}")
        .query(&mut redis.connection())
        .unwrap();
    // Its transaction (`txn`, producer 1000, number 1) is open: the expiry
    // look drops staged offsets only of transactions that ended.
    let () = redis::cmd("HSET")
        .arg("ketch:txn:{txn}")
        .arg("state")
        .arg("Ongoing")
        .arg("pid")
        .arg(1000)
        .arg("epoch")
        .arg(0)
        .arg("n")
        .arg(1)
        .arg("timeout_ms")
        .arg(60_000)
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(
        commit(&mut conn, &standalone, &other, &[(0, 5, ""), (1, 6, "")], -1),
        vec![0, 0]
    );
    // A stable consumer group subscribed to `consumed` commits both topics.
    let group = unique_topic("stable");
    let (member, generation, sync) = join_and_sync_request(&mut conn, &group, &consumed);
    assert_eq!(conn.request(2, &sync).error_code, code::NONE);
    for topic in [&consumed, &other] {
        let committed = commit_as(&mut conn, &group, &member, topic, &[(0, 7, "")], generation);
        assert_eq!(committed, vec![0]);
    }

    // So does the empty group id, whose keys are in different slots of a
    // Redis Cluster.
    assert_eq!(
        commit(&mut conn, "", &other, &[(0, 5, ""), (1, 6, "")], -1),
        vec![0, 0]
    );

    // The standalone groups keep committing partition 1 only.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        for standalone in [standalone.as_str(), ""] {
            assert_eq!(commit(&mut conn, standalone, &other, &[(1, 6, "")], -1), vec![0]);
        }
        let standalone_offsets = fetch(&mut conn, &standalone, &other, &[0, 1]);
        let empty_id_offsets = fetch(&mut conn, "", &other, &[0, 1]);
        let stable_other = fetch(&mut conn, &group, &other, &[0])[0].1;
        if standalone_offsets[0].1 == -1 && empty_id_offsets[0].1 == -1 && stable_other == -1 {
            assert_eq!(standalone_offsets[1].1, 6, "a partition committed lately stays");
            assert_eq!(empty_id_offsets[1].1, 6, "a partition committed lately stays");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not expired: {standalone_offsets:?}, of the empty group id {empty_id_offsets:?}, \
             the stable group's offset of a topic it does not consume {stable_other}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(
        fetch(&mut conn, &group, &consumed, &[0])[0].1,
        7,
        "a subscribed topic's offset stays, however old"
    );
    assert_eq!(
        fetch(&mut conn, &standalone, &consumed, &[0])[0].1,
        4,
        "an offset a transaction is about to replace stays"
    );
    // Once the transaction is gone, it expires too.
    let () = redis::cmd("HDEL")
        .arg(&staged_key)
        .arg(&staged_field)
        .query(&mut redis.connection())
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while fetch(&mut conn, &standalone, &consumed, &[0])[0].1 != -1 {
        assert!(std::time::Instant::now() < deadline, "never expired");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// An OffsetCommit of `version` (2–4) that asks for `retention_ms` of its
/// own (-1: the broker's): its error codes.
#[allow(clippy::too_many_arguments)]
fn commit_retained(
    conn: &mut KafkaConn,
    version: i16,
    group: &str,
    member_id: &str,
    generation: i32,
    topic: &str,
    offsets: &[(i32, i64)],
    retention_ms: i64,
) -> Vec<i16> {
    let request = OffsetCommitRequest::default()
        .with_group_id(StrBytes::from_string(group.to_owned()).into())
        .with_member_id(StrBytes::from_string(member_id.to_owned()))
        .with_generation_id_or_member_epoch(generation)
        .with_retention_time_ms(retention_ms)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(raw::topic_name(topic))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|(p, offset)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(*offset)
                        })
                        .collect(),
                ),
        ]);
    let response = conn.request(version, &request);
    response.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

/// A consumer group of one member subscribed to `topic`, Stable: its
/// member id and generation.
fn stable_group(conn: &mut KafkaConn, group: &str, topic: &str) -> (StrBytes, i32) {
    let (member, generation, sync) = join_and_sync_request(conn, group, topic);
    assert_eq!(conn.request(3, &sync).error_code, code::NONE);
    (member, generation)
}

fn leave(conn: &mut KafkaConn, group: &str, member: &StrBytes) {
    let leave = kafka_protocol::messages::LeaveGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
        .with_member_id(member.clone());
    assert_eq!(conn.request(1, &leave).error_code, code::NONE);
}

/// Polls until `done` holds (at most 20 s), saying what it saw last.
fn until<T: std::fmt::Debug>(what: &str, mut look: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let seen = look();
        if done(&seen) {
            return seen;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {seen:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// OffsetCommit v2–v4's `retention_time_ms` is the offset's own retention,
/// as in Kafka (`expireTimestamp`): shorter than the broker's, the offset
/// expires then, in a group without members, in one that emptied, and in a
/// stable group for a topic its members do not subscribe to; a subscribed
/// topic's offset stays, as does a plain commit beside it.
#[test]
fn an_offsets_own_retention_shorter_than_the_brokers_expires_it_then() {
    let redis = TestRedis::start();
    let ketch = expiring_gateway(&redis, "1h");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let (topic, other) = (unique_topic("own-short"), unique_topic("own-short-other"));
    for t in [&topic, &other] {
        assert_eq!(raw::create_topic(&mut conn, t, 2), code::NONE);
    }
    // Without members: partition 0 kept 300 ms, partition 1 as the broker
    // keeps it.
    let standalone = unique_topic("own-short-standalone");
    assert_eq!(
        commit_retained(&mut conn, 2, &standalone, "", -1, &topic, &[(0, 3)], 300),
        vec![0]
    );
    assert_eq!(
        commit_retained(&mut conn, 2, &standalone, "", -1, &topic, &[(1, 4)], -1),
        vec![0]
    );
    // A consumer group that commits and then empties.
    let emptied = unique_topic("own-short-emptied");
    let (member, generation) = stable_group(&mut conn, &emptied, &topic);
    assert_eq!(
        commit_retained(
            &mut conn,
            4,
            &emptied,
            &member,
            generation,
            &topic,
            &[(0, 5)],
            300
        ),
        vec![0]
    );
    leave(&mut conn, &emptied, &member);
    // A stable group subscribed to `topic`, committing both topics.
    let stable = unique_topic("own-short-stable");
    let (member, generation) = stable_group(&mut conn, &stable, &topic);
    for t in [&topic, &other] {
        assert_eq!(
            commit_retained(&mut conn, 3, &stable, &member, generation, t, &[(0, 6)], 300),
            vec![0]
        );
    }

    until(
        "offsets kept 300 ms of their own never expired",
        || {
            (
                fetch(&mut conn, &standalone, &topic, &[0])[0].1,
                fetch(&mut conn, &emptied, &topic, &[0])[0].1,
                fetch(&mut conn, &stable, &other, &[0])[0].1,
            )
        },
        |seen| *seen == (-1, -1, -1),
    );
    assert_eq!(
        fetch(&mut conn, &standalone, &topic, &[1])[0].1,
        4,
        "a plain commit stays"
    );
    assert_eq!(
        fetch(&mut conn, &stable, &topic, &[0])[0].1,
        6,
        "a subscribed topic's offset stays, whatever its own retention"
    );
}

/// An offset kept longer of its own than the broker's retention outlives
/// it: the expiry look keeps it though it is old, and a group that has no
/// members keeps its keys until then, where a plain commit's group (and a
/// plain commit beside it) goes after the broker's retention. The empty
/// group id's keys are in different slots of a Redis Cluster.
#[test]
fn an_offsets_own_retention_longer_than_the_brokers_keeps_it() {
    let redis = TestRedis::start();
    let ketch = expiring_gateway(&redis, "2s");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("own-long");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let hour = 3_600_000;
    let standalone = unique_topic("own-long-standalone");
    for group in [standalone.as_str(), ""] {
        assert_eq!(
            commit_retained(&mut conn, 2, group, "", -1, &topic, &[(0, 3)], hour),
            vec![0]
        );
        assert_eq!(
            commit_retained(&mut conn, 2, group, "", -1, &topic, &[(1, 4)], -1),
            vec![0]
        );
    }
    // Two consumer groups commit and empty: one kept an hour, one plainly.
    let (kept, plain) = (unique_topic("own-long-kept"), unique_topic("own-long-plain"));
    for (group, retention) in [(&kept, hour), (&plain, -1)] {
        let (member, generation) = stable_group(&mut conn, group, &topic);
        assert_eq!(
            commit_retained(
                &mut conn,
                2,
                group,
                &member,
                generation,
                &topic,
                &[(0, 5)],
                retention
            ),
            vec![0]
        );
        leave(&mut conn, group, &member);
    }

    until(
        "the broker's retention never ran out",
        || {
            (
                fetch(&mut conn, &standalone, &topic, &[1])[0].1,
                fetch(&mut conn, "", &topic, &[1])[0].1,
                fetch(&mut conn, &plain, &topic, &[0])[0].1,
            )
        },
        |seen| *seen == (-1, -1, -1),
    );
    assert_eq!(fetch(&mut conn, &standalone, &topic, &[0])[0].1, 3);
    assert_eq!(fetch(&mut conn, "", &topic, &[0])[0].1, 3);
    assert_eq!(fetch(&mut conn, &kept, &topic, &[0])[0].1, 5);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("ketch:group:{{{kept}}}:offsets"))
        .query(&mut redis.connection())
        .unwrap();
    assert!(
        ttl > hour - 600_000,
        "the emptied group's keys expire with the offset's own retention: {ttl}"
    );

    // A retention no clock can add (Kafka's would overflow): kept for as
    // long as Redis can say, through plain commits after it too.
    let forever = unique_topic("own-long-forever");
    assert_eq!(
        commit_retained(&mut conn, 2, &forever, "", -1, &topic, &[(0, 3)], i64::MAX),
        vec![0]
    );
    assert_eq!(
        commit_retained(&mut conn, 2, &forever, "", -1, &topic, &[(1, 4)], -1),
        vec![0]
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("ketch:group:{{{forever}}}:offsets"))
        .query(&mut redis.connection())
        .unwrap();
    assert!(ttl > 1 << 52, "kept for ever: {ttl}");
}

/// A `groups.offsets_retention` longer than Redis can count ("for ever")
/// keeps a group's offsets as long as Redis can say, not for no time.
#[test]
fn a_retention_longer_than_redis_counts_keeps_the_offsets() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "groups.offsets_retention=200000000000d"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("forever");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    // A group without members: its keys get the retention at once.
    let group = unique_topic("forever-group");
    assert_eq!(commit(&mut conn, &group, &topic, &[(0, 7, "")], -1), vec![0]);
    assert_eq!(fetch(&mut conn, &group, &topic, &[0])[0].1, 7);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("ketch:group:{{{group}}}:offsets"))
        .query(&mut redis.connection())
        .unwrap();
    assert!(ttl > 1 << 52, "kept for ever: {ttl}");
}

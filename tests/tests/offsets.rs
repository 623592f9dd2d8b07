//! Committed offsets in Redis: OffsetCommit, OffsetFetch and OffsetDelete
//! for a group without members (consumers that assign their own partitions),
//! through the raw protocol so every error code is visible.

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};

const OFFSET_METADATA_TOO_LARGE: i16 = 12;
const ILLEGAL_GENERATION: i16 = 22;
const GROUP_ID_NOT_FOUND: i16 = 69;

fn commit(
    conn: &mut KafkaConn,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64, &str)],
    generation: i32,
) -> Vec<i16> {
    let request = OffsetCommitRequest::default()
        .with_group_id(StrBytes::from_string(group.to_owned()).into())
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

    let codes = commit(
        &mut conn,
        &group,
        &topic,
        &[(0, 10, "a"), (1, 20, "b"), (7, 5, ""), (2, 1, &"x".repeat(17))],
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
            (1, 20, "b".to_owned()),
            (2, -1, String::new())
        ]
    );
    // A group without members keeps its offsets for the retention from the commit.
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("ketch:group:{{{group}}}:offsets"))
        .query(&mut redis.connection())
        .unwrap();
    assert!((3_500_000..=3_600_000).contains(&ttl), "offsets TTL {ttl} ms");
    // A generation for a group that has none is stale.
    assert_eq!(
        commit(&mut conn, &group, &topic, &[(0, 11, "")], 3),
        vec![ILLEGAL_GENERATION]
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

    let unknown = delete.with_group_id(StrBytes::from_static_str("no-such-group").into());
    assert_eq!(conn.request(0, &unknown).error_code, GROUP_ID_NOT_FOUND);

    // Offsets live in Redis: a restarted gateway still has them.
    drop(conn);
    drop(ketch);
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(fetch(&mut conn, &group, &topic, &[1])[0].1, 20);
}

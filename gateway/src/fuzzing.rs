//! The request fuzz target's body (`fuzz/fuzz_targets/request.rs`), also
//! run over the committed corpus by this crate's tests.
//!
//! The input is a sequence of request frames (each a big-endian u16 length
//! and the frame without its size prefix), answered in order by one gateway
//! context over [`MemoryStorage`], so a later request sees what an earlier
//! one created (a topic, a group, committed offsets). Time is paused: waits
//! (long-polling fetches, rebalances) end as soon as nothing else can run.
//! Whatever the bytes, nothing may panic or hang.

use std::sync::Arc;

use bytes::Bytes;
use ketch_config::Settings;
use tokio::sync::watch;

use crate::memory::MemoryStorage;
use crate::{Context, server};

/// Frames answered per input at most.
const MAX_FRAMES: usize = 32;

/// The frames of an input.
pub fn frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    while data.len() >= 2 && frames.len() < MAX_FRAMES {
        let len = usize::from(u16::from_be_bytes([data[0], data[1]]));
        let end = (2 + len).min(data.len());
        frames.push(&data[2..end]);
        data = &data[end..];
    }
    frames
}

/// Encodes frames as an input (for seeds).
pub fn input(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        let len = u16::try_from(frame.len()).expect("a seed frame under 64 KiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(frame);
    }
    out
}

/// Settings that keep one input's work small.
fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.topics.max_partitions = 64;
    settings.topics.default_partitions = 2;
    settings.broker.id = Some(0);
    settings
}

/// Runs one input; returns how many of its frames were answered (the
/// others would have closed their connection).
pub fn requests(data: &[u8]) -> usize {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
    }
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let (_stop, shutdown) = watch::channel(false);
            let storage = Arc::new(MemoryStorage::default());
            let metrics = Arc::new(ketch_tiering::Metrics::default());
            let ctx = Context::new(settings(), storage, metrics, shutdown);
            let mut answered = 0;
            for frame in frames(data) {
                if server::answer_frame(&ctx, Bytes::copy_from_slice(frame))
                    .await
                    .is_ok()
                {
                    answered += 1;
                }
            }
            answered
        })
    })
}

#[cfg(test)]
mod tests {
    /// Every committed seed of the request fuzz target still runs cleanly.
    #[test]
    fn the_fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/request");
        let mut replayed = 0;
        for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/request") {
            let path = entry.expect("corpus entry").path();
            let input = std::fs::read(&path).expect("read seed");
            let answered = super::requests(&input);
            // The hand-written seeds are all well-formed requests.
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
            {
                assert_eq!(answered, super::frames(&input).len(), "{}", path.display());
            }
            replayed += 1;
        }
        assert!(replayed > 0, "no seeds in {}", dir.display());
    }

    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::{Encodable, HeaderVersion, StrBytes};

    fn s(text: &str) -> StrBytes {
        StrBytes::from_string(text.to_owned())
    }

    fn frame<R: Encodable + HeaderVersion>(key: ApiKey, version: i16, body: &R) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(1)
            .with_client_id(Some(s("fuzz")))
            .encode(&mut buf, R::header_version(version))
            .expect("header");
        body.encode(&mut buf, version).expect("body");
        buf.to_vec()
    }

    fn batch(values: &[&[u8]]) -> bytes::Bytes {
        let mut builder = ketch_storage::batch::BatchBuilder::new(0);
        for (i, value) in values.iter().enumerate() {
            builder.push(
                1_700_000_000_000 + i as i64,
                Some(b"k"),
                Some(value),
                std::iter::empty(),
            );
        }
        builder.finish()
    }

    fn topic_name(name: &str) -> TopicName {
        TopicName(s(name))
    }

    fn produce(topic: &str, partition: i32, values: &[&[u8]]) -> Vec<u8> {
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(1000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(topic_name(topic))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(partition)
                            .with_records(Some(batch(values))),
                    ]),
            ]);
        frame(ApiKey::Produce, 9, &request)
    }

    fn fetch(topic: &str, partition: i32, offset: i64) -> Vec<u8> {
        let request = FetchRequest::default()
            .with_max_wait_ms(100)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(topic_name(topic))
                    .with_partitions(vec![
                        FetchPartition::default()
                            .with_partition(partition)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(1 << 20),
                    ]),
            ]);
        frame(ApiKey::Fetch, 12, &request)
    }

    fn list_offsets(topic: &str, timestamp: i64) -> Vec<u8> {
        let request = ListOffsetsRequest::default().with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(timestamp),
                ]),
        ]);
        frame(ApiKey::ListOffsets, 7, &request)
    }

    fn create_topic(topic: &str, partitions: i32) -> Vec<u8> {
        let request = CreateTopicsRequest::default()
            .with_timeout_ms(1000)
            .with_topics(vec![
                CreatableTopic::default()
                    .with_name(topic_name(topic))
                    .with_num_partitions(partitions)
                    .with_replication_factor(1),
            ]);
        frame(ApiKey::CreateTopics, 5, &request)
    }

    fn join(group: &str, member: &str, version: i16) -> Vec<u8> {
        let request = JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_member_id(s(member))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(s("range"))
                    .with_metadata(bytes::Bytes::from_static(b"\0\0\0\0\0\x01\0\x01t\0\0\0\0")),
            ]);
        frame(ApiKey::JoinGroup, version, &request)
    }

    fn commit(group: &str, topic: &str, offset: i64) -> Vec<u8> {
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![
                OffsetCommitRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(offset),
                    ]),
            ]);
        frame(ApiKey::OffsetCommit, 8, &request)
    }

    fn offset_fetch(group: &str, topic: &str) -> Vec<u8> {
        let request = OffsetFetchRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(Some(vec![
                OffsetFetchRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(vec![0, 1]),
            ]));
        frame(ApiKey::OffsetFetch, 7, &request)
    }

    /// Writes the seeds of `fuzz/corpus/request`: request sequences that
    /// reach every API. Run with `--ignored` to regenerate.
    #[test]
    #[ignore = "writes fuzz/corpus/request"]
    fn write_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/request");
        std::fs::create_dir_all(&dir).expect("create the corpus directory");
        let api_versions = frame(
            ApiKey::ApiVersions,
            3,
            &ApiVersionsRequest::default()
                .with_client_software_name(s("fuzz"))
                .with_client_software_version(s("1")),
        );
        let metadata = frame(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(topic_name("auto"))),
                ]))
                .with_allow_auto_topic_creation(true),
        );
        let delete_records = frame(
            ApiKey::DeleteRecords,
            2,
            &DeleteRecordsRequest::default()
                .with_timeout_ms(1000)
                .with_topics(vec![
                    DeleteRecordsTopic::default()
                        .with_name(topic_name("t"))
                        .with_partitions(vec![
                            DeleteRecordsPartition::default()
                                .with_partition_index(0)
                                .with_offset(1),
                        ]),
                ]),
        );
        let describe_configs = frame(
            ApiKey::DescribeConfigs,
            4,
            &DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("t")),
            ]),
        );
        let create_partitions = frame(
            ApiKey::CreatePartitions,
            3,
            &CreatePartitionsRequest::default()
                .with_timeout_ms(1000)
                .with_topics(vec![
                    CreatePartitionsTopic::default()
                        .with_name(topic_name("t"))
                        .with_count(3),
                ]),
        );
        let delete_topics = frame(
            ApiKey::DeleteTopics,
            5,
            &DeleteTopicsRequest::default()
                .with_timeout_ms(1000)
                .with_topic_names(vec![topic_name("t")]),
        );
        let find_coordinator = frame(
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default().with_coordinator_keys(vec![s("g")]),
        );
        let heartbeat = frame(
            ApiKey::Heartbeat,
            4,
            &HeartbeatRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_member_id(s("m"))
                .with_generation_id(1),
        );
        let sync = frame(
            ApiKey::SyncGroup,
            5,
            &SyncGroupRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_member_id(s("m"))
                .with_generation_id(1)
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(Some(s("range"))),
        );
        let leave = frame(
            ApiKey::LeaveGroup,
            5,
            &LeaveGroupRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_members(vec![MemberIdentity::default().with_member_id(s("m"))]),
        );
        let describe_groups = frame(
            ApiKey::DescribeGroups,
            5,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]),
        );
        let list_groups = frame(ApiKey::ListGroups, 4, &ListGroupsRequest::default());
        let delete_groups = frame(
            ApiKey::DeleteGroups,
            2,
            &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g"))]),
        );
        let init_producer_id = frame(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transaction_timeout_ms(1000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        );
        let describe_cluster = frame(ApiKey::DescribeCluster, 0, &DescribeClusterRequest::default());
        let seeds: Vec<(&str, Vec<Vec<u8>>)> = vec![
            (
                "api-versions",
                vec![api_versions.clone(), metadata.clone(), describe_cluster],
            ),
            (
                "topic-lifecycle",
                vec![
                    create_topic("t", 2),
                    produce("t", 0, &[b"one", b"two", b"three"]),
                    produce("t", 1, &[b"four"]),
                    fetch("t", 0, 0),
                    list_offsets("t", -1),
                    list_offsets("t", -2),
                    list_offsets("t", -3),
                    list_offsets("t", 1_700_000_000_001),
                    delete_records,
                    fetch("t", 0, 1),
                    describe_configs,
                    create_partitions,
                    metadata,
                    delete_topics,
                ],
            ),
            (
                "groups",
                vec![
                    find_coordinator,
                    create_topic("t", 1),
                    join("g", "", 3),
                    join("g", "", 9),
                    heartbeat,
                    sync,
                    commit("g", "t", 5),
                    offset_fetch("g", "t"),
                    describe_groups,
                    list_groups,
                    leave,
                    delete_groups,
                ],
            ),
            (
                "producer",
                vec![
                    init_producer_id,
                    create_topic("t", 1),
                    produce("t", 0, &[b"x"]),
                    fetch("t", 0, 0),
                ],
            ),
        ];
        for (name, frames) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), super::input(&frames)).expect("write seed");
        }
    }
}

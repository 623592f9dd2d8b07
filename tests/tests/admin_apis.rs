//! The admin APIs tools call about replicas and log directories, answered
//! as a system of one logical replica per partition on shared storage:
//! DescribeTopicPartitions (paged), DescribeLogDirs (Redis and archive
//! sizes), AlterReplicaLogDirs, ElectLeaders, List/AlterPartitionReassignments,
//! and manual replica assignments in CreateTopics and CreatePartitions, on
//! one gateway, on two, and on two behind a load balancer.
//!
//! Raw protocol for the APIs rdkafka has no call for, rdkafka for the
//! assignments (its CreateTopics and CreatePartitions take them).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::alter_replica_log_dirs_request::{AlterReplicaLogDir, AlterReplicaLogDirTopic};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterReplicaLogDirsRequest, BrokerId, CreateTopicsRequest,
    DescribeClusterRequest, DescribeLogDirsRequest, DescribeLogDirsResponse, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, ElectLeadersRequest, ListPartitionReassignmentsRequest,
};
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code, topic_name};
use ketch_tests::servers::Balanced;
use ketch_tests::{Ketch, TestRedis, admin_options, runtime, unique_topic};
use rdkafka::admin::{NewPartitions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::error::RDKafkaErrorCode;

const INVALID_REPLICATION_FACTOR: i16 = 38;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
const LOG_DIR_NOT_FOUND: i16 = 57;
const REPLICA_NOT_AVAILABLE: i16 = 9;
const ELECTION_NOT_NEEDED: i16 = 84;
const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;

fn start() -> (TestRedis, Ketch) {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    (redis, ketch)
}

/// (broker ids, each partition's leader) as Metadata through `via` reports them.
fn metadata(via: &Ketch, topic: &str) -> (BTreeSet<i32>, Vec<i32>) {
    let metadata = via
        .consumer()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let brokers = metadata.brokers().iter().map(|b| b.id()).collect();
    let mut partitions: Vec<(i32, i32)> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect();
    partitions.sort_unstable();
    (
        brokers,
        partitions.into_iter().map(|(_, leader)| leader).collect(),
    )
}

fn describe_topic_partitions(
    conn: &mut KafkaConn,
    topics: &[&str],
    limit: i32,
    cursor: Option<(&str, i32)>,
) -> DescribeTopicPartitionsResponse {
    let request = DescribeTopicPartitionsRequest::default()
        .with_topics(
            topics
                .iter()
                .map(|t| TopicRequest::default().with_name(topic_name(t)))
                .collect(),
        )
        .with_response_partition_limit(limit)
        .with_cursor(cursor.map(|(topic, partition)| {
            Cursor::default()
                .with_topic_name(topic_name(topic))
                .with_partition_index(partition)
        }));
    conn.request(0, &request)
}

/// A partition as DescribeTopicPartitions lists it: (topic, partition,
/// leader, replicas).
type Listed = (String, i32, i32, Vec<i32>);

/// Every partition the pages of DescribeTopicPartitions list, following
/// the cursor; the topics answered with an error; and how many pages.
fn all_pages(
    conn: &mut KafkaConn,
    topics: &[&str],
    limit: i32,
) -> (Vec<Listed>, BTreeMap<String, i16>, usize) {
    let mut listed = Vec::new();
    let mut errors = BTreeMap::new();
    let mut pages = 0;
    let mut cursor: Option<(String, i32)> = None;
    loop {
        let response = describe_topic_partitions(
            conn,
            topics,
            limit,
            cursor.as_ref().map(|(t, p)| (t.as_str(), *p)),
        );
        pages += 1;
        let on_page: usize = response.topics.iter().map(|t| t.partitions.len()).sum();
        assert!(on_page <= limit as usize, "a page of {on_page} partitions");
        for topic in &response.topics {
            let name = topic.name.as_ref().expect("a name").to_string();
            if topic.error_code != code::NONE {
                errors.insert(name, topic.error_code);
                continue;
            }
            for p in &topic.partitions {
                assert_eq!(p.error_code, code::NONE);
                let replicas = p.replica_nodes.iter().map(|b| **b).collect();
                listed.push((name.clone(), p.partition_index, *p.leader_id, replicas));
            }
        }
        match response.next_cursor {
            Some(next) => cursor = Some((next.topic_name.to_string(), next.partition_index)),
            None => return (listed, errors, pages),
        }
        assert!(pages < 100, "the cursor never ends");
    }
}

fn describe_log_dirs(
    conn: &mut KafkaConn,
    version: i16,
    topics: Option<&[(&str, &[i32])]>,
) -> DescribeLogDirsResponse {
    let topics = topics.map(|topics| {
        topics
            .iter()
            .map(|(t, ps)| {
                DescribableLogDirTopic::default()
                    .with_topic(topic_name(t))
                    .with_partitions(ps.to_vec())
            })
            .collect()
    });
    conn.request(version, &DescribeLogDirsRequest::default().with_topics(topics))
}

/// Each log directory's partitions of `topic`: directory → partition → size.
fn sizes(response: &DescribeLogDirsResponse, topic: &str) -> BTreeMap<String, BTreeMap<i32, i64>> {
    response
        .results
        .iter()
        .map(|dir| {
            assert_eq!(dir.error_code, code::NONE, "{dir:?}");
            let partitions = dir
                .topics
                .iter()
                .filter(|t| t.name.as_str() == topic)
                .flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.partition_size)))
                .collect();
            (dir.log_dir.to_string(), partitions)
        })
        .collect()
}

/// The Redis directory and the archive's, in that order.
fn dirs(response: &DescribeLogDirsResponse) -> (String, String) {
    assert_eq!(response.results.len(), 2, "{response:?}");
    (
        response.results[0].log_dir.to_string(),
        response.results[1].log_dir.to_string(),
    )
}

fn elect(
    conn: &mut KafkaConn,
    version: i16,
    election_type: i8,
    topics: Option<&[(&str, &[i32])]>,
) -> kafka_protocol::messages::ElectLeadersResponse {
    let topics = topics.map(|topics| {
        topics
            .iter()
            .map(|(t, ps)| {
                TopicPartitions::default()
                    .with_topic(topic_name(t))
                    .with_partitions(ps.to_vec())
            })
            .collect()
    });
    let request = ElectLeadersRequest::default()
        .with_election_type(election_type)
        .with_topic_partitions(topics)
        .with_timeout_ms(10_000);
    conn.request(version, &request)
}

/// (topic, partition) → error code of an ElectLeaders response.
fn election_codes(response: &kafka_protocol::messages::ElectLeadersResponse) -> BTreeMap<(String, i32), i16> {
    response
        .replica_election_results
        .iter()
        .flat_map(|t| {
            t.partition_result
                .iter()
                .map(|p| ((t.topic.to_string(), p.partition_id), p.error_code))
        })
        .collect()
}

fn reassign(
    conn: &mut KafkaConn,
    version: i16,
    allow_factor_change: bool,
    targets: &[(&str, i32, Option<&[i32]>)],
) -> kafka_protocol::messages::AlterPartitionReassignmentsResponse {
    let mut topics: Vec<ReassignableTopic> = Vec::new();
    for (topic, partition, replicas) in targets {
        let partition = ReassignablePartition::default()
            .with_partition_index(*partition)
            .with_replicas(replicas.map(|r| r.iter().map(|&b| BrokerId(b)).collect()));
        match topics.iter_mut().find(|t| t.name.as_str() == *topic) {
            Some(t) => t.partitions.push(partition),
            None => topics.push(
                ReassignableTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    let request = AlterPartitionReassignmentsRequest::default()
        .with_allow_replication_factor_change(allow_factor_change)
        .with_topics(topics);
    conn.request(version, &request)
}

/// (topic, partition) → (error code, message) of an AlterPartitionReassignments response.
fn reassignment_codes(
    response: &kafka_protocol::messages::AlterPartitionReassignmentsResponse,
) -> BTreeMap<(String, i32), (i16, String)> {
    response
        .responses
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                let message = p
                    .error_message
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                ((t.name.to_string(), p.partition_index), (p.error_code, message))
            })
        })
        .collect()
}

/// Produces `batches` batches of ten 1 KiB records, stamped recently
/// (records from 1970 would be past retention.ms).
fn produce_kib(conn: &mut KafkaConn, topic: &str, partition: i32, batches: usize) {
    let value = vec![b'v'; 1024];
    let now = batch::at(0);
    for _ in 0..batches {
        let records: Vec<Record> = (0..10).map(|_| Record::value(now, &value)).collect();
        assert_eq!(
            raw::produce(conn, topic, partition, batch::encode(&records)).0,
            code::NONE
        );
    }
}

#[test]
fn describe_topic_partitions_pages_every_partition_exactly_once_and_reports_metadatas_leader() {
    let (_redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let prefix = unique_topic("paged");
    let topics: Vec<(String, i32)> = [("a", 3), ("b", 5), ("c", 1)]
        .into_iter()
        .map(|(suffix, partitions)| (format!("{prefix}-{suffix}"), partitions))
        .collect();
    for (topic, partitions) in &topics {
        assert_eq!(raw::create_topic(&mut conn, topic, *partitions), code::NONE);
    }
    let unknown = format!("{prefix}-zz-unknown");
    let invalid = format!("{prefix}-bad name");
    let mut named: Vec<&str> = topics.iter().map(|(t, _)| t.as_str()).collect();
    named.push(&unknown);
    named.push(&invalid);

    for limit in [1, 2, 4, 100] {
        let (listed, errors, pages) = all_pages(&mut conn, &named, limit);
        let mut seen: BTreeMap<(String, i32), usize> = BTreeMap::new();
        for (topic, partition, leader, replicas) in &listed {
            *seen.entry((topic.clone(), *partition)).or_default() += 1;
            assert_eq!(replicas, &vec![*leader], "one replica, the leader");
        }
        let expected: BTreeMap<(String, i32), usize> = topics
            .iter()
            .flat_map(|(t, n)| (0..*n).map(move |p| ((t.clone(), p), 1)))
            .collect();
        assert_eq!(seen, expected, "limit {limit}: every partition once");
        assert_eq!(
            errors,
            BTreeMap::from([
                (invalid.clone(), 17), // INVALID_TOPIC_EXCEPTION
                (unknown.clone(), code::UNKNOWN_TOPIC_OR_PARTITION)
            ]),
            "limit {limit}"
        );
        if limit == 1 {
            assert!(pages >= 9, "{pages} pages of one partition");
        }
    }

    // Leaders are Metadata's.
    let (listed, _, _) = all_pages(&mut conn, &named, 100);
    for (topic, _) in &topics {
        let (_, leaders) = metadata(&ketch, topic);
        let reported: Vec<i32> = listed
            .iter()
            .filter(|(t, ..)| t == topic)
            .map(|(_, _, leader, _)| *leader)
            .collect();
        assert_eq!(reported, leaders, "{topic}");
    }

    // No topics named: every topic, paged the same way.
    let (listed, errors, _) = all_pages(&mut conn, &[], 2);
    assert!(errors.is_empty(), "{errors:?}");
    let ours = listed.iter().filter(|(t, ..)| t.starts_with(&prefix)).count();
    assert_eq!(ours, 9);

    // A cursor naming a topic not asked about is an invalid request.
    let response = describe_topic_partitions(&mut conn, &named[..1], 10, Some((&unknown, 0)));
    assert_eq!(response.topics.len(), 1);
    assert_eq!(response.topics[0].error_code, code::INVALID_REQUEST);
    assert!(response.topics[0].partitions.is_empty());
}

#[test]
fn describe_log_dirs_reports_redis_bytes_that_grow_as_data_is_produced() {
    let (_redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("sized");
    let other = unique_topic("other");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    assert_eq!(raw::create_topic(&mut conn, &other, 1), code::NONE);

    let before = describe_log_dirs(&mut conn, 4, Some(&[(&topic, &[0, 1, 7])]));
    let (redis_dir, archive_dir) = dirs(&before);
    assert!(redis_dir.starts_with("redis://127.0.0.1:"), "{redis_dir}");
    assert!(!redis_dir.contains('@'), "{redis_dir}");
    assert!(archive_dir.starts_with("file:///"), "{archive_dir}");
    let before = sizes(&before, &topic);
    assert_eq!(
        before[&redis_dir].keys().copied().collect::<Vec<_>>(),
        vec![0, 1],
        "partition 7 does not exist"
    );
    assert!(
        before[&archive_dir].is_empty(),
        "no remote storage, nothing archived"
    );

    produce_kib(&mut conn, &topic, 0, 20); // 200 KiB of values
    let after_response = describe_log_dirs(&mut conn, 4, None);
    let after = sizes(&after_response, &topic);
    let grown = after[&redis_dir][&0] - before[&redis_dir][&0];
    assert!(
        grown >= 150_000,
        "partition 0 grew by {grown} bytes: {before:?} → {after:?}"
    );
    assert!(after[&redis_dir][&1] < 10_000, "{after:?}");
    assert!(
        sizes(&after_response, &other)[&redis_dir].contains_key(&0),
        "null topics: every partition"
    );
    for dir in &after_response.results {
        assert_eq!((dir.total_bytes, dir.usable_bytes), (-1, -1), "no maxmemory");
    }

    // Versions before 4 have no volume sizes; 1 is what older tools send.
    let v1 = describe_log_dirs(&mut conn, 1, Some(&[(&topic, &[0])]));
    assert_eq!(sizes(&v1, &topic)[&redis_dir].len(), 1);
}

#[test]
fn describe_log_dirs_sizes_archived_segments_in_the_archive_directory() {
    let redis = TestRedis::start();
    let data_dir = tempfile::tempdir().expect("temp dir");
    let data_setting = format!("tiering.data_dir={}", data_dir.path().display());
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "tiering.tick_interval=100ms", "--set", &data_setting],
    );
    let rt = runtime();
    let topic = unique_topic("archived");
    ketch.create_topic_with(
        &rt,
        &topic,
        1,
        &[("remote.storage.enable", "true"), ("segment.bytes", "4096")],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    produce_kib(&mut conn, &topic, 0, 3);

    // The storage worker seals and archives segments on its own schedule.
    let deadline = Instant::now() + Duration::from_secs(60);
    let archived_bytes = loop {
        let archived: Vec<i64> = redis
            .segments(&topic, 0)
            .iter()
            .filter(|s| s.get("path").is_some_and(|p| !p.is_null()))
            .map(|s| s["file_bytes"].as_i64().expect("file_bytes"))
            .collect();
        if !archived.is_empty() {
            break archived.iter().sum::<i64>();
        }
        assert!(Instant::now() < deadline, "segments not archived: {archived:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let response = describe_log_dirs(&mut conn, 4, Some(&[(&topic, &[0])]));
    let (redis_dir, archive_dir) = dirs(&response);
    assert_eq!(
        archive_dir,
        format!("file://{}/warehouse", data_dir.path().display())
    );
    let sizes = sizes(&response, &topic);
    let reported = sizes[&archive_dir][&0];
    // Another segment may be archived between the two reads.
    assert!(
        reported >= archived_bytes && reported > 0,
        "archive dir says {reported}, segment records {archived_bytes}"
    );
    assert!(sizes[&redis_dir][&0] > 0);
}

#[test]
fn alter_replica_log_dirs_moves_nothing() {
    let (_redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("stays");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let (redis_dir, archive_dir) = dirs(&describe_log_dirs(&mut conn, 4, Some(&[])));
    let into = |path: &str, partitions: &[i32]| {
        AlterReplicaLogDir::default()
            .with_path(raw_str(path))
            .with_topics(vec![
                AlterReplicaLogDirTopic::default()
                    .with_name(topic_name(&topic))
                    .with_partitions(partitions.to_vec()),
            ])
    };
    let request = AlterReplicaLogDirsRequest::default().with_dirs(vec![
        into(&redis_dir, &[0, 5]),
        into(&archive_dir, &[1]),
        into("/var/lib/kafka/data", &[0]),
    ]);
    for version in [1, 2] {
        let response = conn.request(version, &request);
        assert_eq!(response.results.len(), 1, "one result per topic");
        let codes: Vec<(i32, i16)> = response.results[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.error_code))
            .collect();
        assert_eq!(
            codes,
            vec![
                (0, code::NONE), // already there
                (5, REPLICA_NOT_AVAILABLE),
                (1, LOG_DIR_NOT_FOUND),
                (0, LOG_DIR_NOT_FOUND),
            ],
            "version {version}"
        );
    }
}

#[test]
fn elect_leaders_finds_no_election_needed() {
    let (_redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("elected");
    let unknown = unique_topic("unknown");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    for (version, election_type) in [(0, 0), (1, 0), (2, 0), (2, 1)] {
        let response = elect(
            &mut conn,
            version,
            election_type,
            Some(&[(&topic, &[0, 1, 2]), (&unknown, &[0])]),
        );
        assert_eq!(response.error_code, code::NONE);
        assert_eq!(
            election_codes(&response),
            BTreeMap::from([
                ((topic.clone(), 0), ELECTION_NOT_NEEDED),
                ((topic.clone(), 1), ELECTION_NOT_NEEDED),
                ((topic.clone(), 2), code::UNKNOWN_TOPIC_OR_PARTITION),
                ((unknown.clone(), 0), code::UNKNOWN_TOPIC_OR_PARTITION),
            ]),
            "version {version}, type {election_type}"
        );
    }
    // All partitions: every topic, none needing an election (Kafka leaves those out).
    let all = elect(&mut conn, 2, 0, None);
    assert_eq!(all.error_code, code::NONE);
    let ours = all
        .replica_election_results
        .iter()
        .find(|t| t.topic.as_str() == topic)
        .expect("our topic answered");
    assert!(ours.partition_result.is_empty(), "{ours:?}");

    let bad_type = elect(&mut conn, 2, 7, Some(&[(&topic, &[0])]));
    assert_eq!(bad_type.error_code, code::INVALID_REQUEST);
    assert_eq!(
        election_codes(&bad_type)[&(topic.clone(), 0)],
        code::INVALID_REQUEST
    );
}

#[test]
fn partition_reassignments_are_never_in_progress_and_never_start() {
    let (_redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("unmoved");
    let unknown = unique_topic("unknown");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let (_, leaders) = metadata(&ketch, &topic);

    let listed = conn.request(0, &ListPartitionReassignmentsRequest::default().with_topics(None));
    assert_eq!((listed.error_code, listed.topics.len()), (code::NONE, 0));
    let named = ListPartitionReassignmentsRequest::default().with_topics(Some(vec![
        ListPartitionReassignmentsTopics::default()
            .with_name(topic_name(&topic))
            .with_partition_indexes(vec![0, 1, 9]),
        ListPartitionReassignmentsTopics::default()
            .with_name(topic_name(&unknown))
            .with_partition_indexes(vec![0]),
    ]));
    let listed = conn.request(0, &named);
    assert_eq!((listed.error_code, listed.topics.len()), (code::NONE, 0));

    let leader = leaders[0];
    let nobody = 999_999;
    for version in [0, 1] {
        let response = reassign(
            &mut conn,
            version,
            true,
            &[
                (&topic, 0, Some(&[leader])),
                (&topic, 1, Some(&[nobody])),
                (&topic, 0, None),
                (&topic, 1, Some(&[leader, leader])),
                (&topic, 7, Some(&[leader])),
                (&unknown, 0, Some(&[leader])),
            ],
        );
        assert_eq!(response.error_code, code::NONE);
        let codes = reassignment_codes(&response);
        let all: Vec<i16> = response.responses[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .collect();
        assert_eq!(
            all,
            vec![
                code::NONE, // already its only replica
                INVALID_REPLICA_ASSIGNMENT,
                NO_REASSIGNMENT_IN_PROGRESS,
                INVALID_REPLICA_ASSIGNMENT,
                code::UNKNOWN_TOPIC_OR_PARTITION,
            ],
            "version {version}"
        );
        assert!(
            response.responses[0].partitions[1]
                .error_message
                .as_deref()
                .is_some_and(|m| m.contains(&format!("broker {nobody},"))),
            "{response:?}"
        );
        assert_eq!(codes[&(unknown.clone(), 0)].0, code::UNKNOWN_TOPIC_OR_PARTITION);
    }
    let response = reassign(&mut conn, 1, false, &[(&topic, 0, Some(&[]))]);
    assert_eq!(
        response.responses[0].partitions[0].error_code, INVALID_REPLICA_ASSIGNMENT,
        "an empty replica list"
    );
    assert!(!response.allow_replication_factor_change, "v1 echoes the flag");
    // Nothing moved.
    assert_eq!(metadata(&ketch, &topic).1, leaders);
}

#[test]
fn create_topics_accepts_assignments_to_this_broker_and_refuses_unknown_brokers() {
    let (redis, ketch) = start();
    let rt = runtime();
    let me = ketch
        .consumer()
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata")
        .brokers()[0]
        .id();

    let assigned = unique_topic("assigned");
    let stray = unique_topic("stray");
    let doubled = unique_topic("doubled");
    let here: &[&[i32]] = &[&[me], &[me], &[me]];
    let elsewhere: &[&[i32]] = &[&[me], &[me + 1]];
    let two: &[&[i32]] = &[&[me, me + 1]];
    let topics = [
        NewTopic::new(&assigned, 3, TopicReplication::Variable(here)),
        NewTopic::new(&stray, 2, TopicReplication::Variable(elsewhere)),
        NewTopic::new(&doubled, 1, TopicReplication::Variable(two)),
    ];
    let results = rt
        .block_on(ketch.admin().create_topics(&topics, &admin_options()))
        .expect("CreateTopics");
    assert_eq!(
        results,
        vec![
            Ok(assigned.clone()),
            Err((stray.clone(), RDKafkaErrorCode::InvalidReplicaAssignment)),
            Err((doubled.clone(), RDKafkaErrorCode::InvalidReplicaAssignment)),
        ]
    );
    assert_eq!(metadata(&ketch, &assigned).1.len(), 3);
    assert!(!redis.topic_exists(&stray), "a refused topic was created");
    assert!(!redis.topic_exists(&doubled), "a refused topic was created");

    // The message names the broker that does not exist.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let raw_stray = unique_topic("raw-stray");
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![
            CreatableTopic::default()
                .with_name(topic_name(&raw_stray))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
                .with_assignments(vec![
                    CreatableReplicaAssignment::default()
                        .with_partition_index(0)
                        .with_broker_ids(vec![BrokerId(4242)]),
                ]),
        ]);
    let response = conn.request(5, &request);
    let result = &response.topics[0];
    assert_eq!(result.error_code, INVALID_REPLICA_ASSIGNMENT);
    let message = result.error_message.as_deref().unwrap_or_default();
    assert!(message.contains("broker 4242,"), "{message}");
    assert!(!redis.topic_exists(&raw_stray));

    // CreatePartitions: the same rule for the new partitions.
    assert_eq!(
        grow(&ketch, &rt, &assigned, 4, &[&[4242]]),
        Err((assigned.clone(), RDKafkaErrorCode::InvalidReplicaAssignment))
    );
    assert_eq!(redis.topic_tags(&assigned).len(), 3, "nothing added");
    assert_eq!(
        grow(&ketch, &rt, &assigned, 5, &[&[me], &[me]]),
        Ok(assigned.clone())
    );
    assert_eq!(redis.topic_tags(&assigned).len(), 5);
}

/// CreatePartitions to `total` partitions, the new ones assigned as `assignment` says.
fn grow(
    ketch: &Ketch,
    rt: &tokio::runtime::Runtime,
    topic: &str,
    total: usize,
    assignment: &[&[i32]],
) -> rdkafka::admin::TopicResult {
    let mut results = rt
        .block_on(ketch.admin().create_partitions(
            &[NewPartitions::new(topic, total).assign(assignment)],
            &admin_options(),
        ))
        .expect("CreatePartitions");
    assert_eq!(results.len(), 1);
    results.remove(0)
}

#[test]
fn without_cluster_permissions_every_admin_api_is_refused() {
    let redis = TestRedis::start();
    // ACLs on and none granted: the anonymous client may do nothing.
    let ketch = Ketch::start(&redis.url(), &["--set", "acl.enabled=true"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("guarded");

    let log_dirs = describe_log_dirs(&mut conn, 4, None);
    assert_eq!(log_dirs.error_code, code::CLUSTER_AUTHORIZATION_FAILED);
    assert!(log_dirs.results.is_empty());

    let election = elect(&mut conn, 2, 0, Some(&[(&topic, &[0])]));
    assert_eq!(election.error_code, code::CLUSTER_AUTHORIZATION_FAILED);
    assert_eq!(
        election_codes(&election)[&(topic.clone(), 0)],
        code::CLUSTER_AUTHORIZATION_FAILED
    );

    let listed = conn.request(0, &ListPartitionReassignmentsRequest::default().with_topics(None));
    assert_eq!(listed.error_code, code::CLUSTER_AUTHORIZATION_FAILED);

    let response = reassign(&mut conn, 0, true, &[(&topic, 0, None)]);
    assert_eq!(response.error_code, code::CLUSTER_AUTHORIZATION_FAILED);
    assert_eq!(
        response.responses[0].partitions[0].error_code,
        code::CLUSTER_AUTHORIZATION_FAILED
    );

    let moved = conn.request(
        2,
        &AlterReplicaLogDirsRequest::default().with_dirs(vec![
            AlterReplicaLogDir::default()
                .with_path(raw_str("/x"))
                .with_topics(vec![
                    AlterReplicaLogDirTopic::default()
                        .with_name(topic_name(&topic))
                        .with_partitions(vec![0]),
                ]),
        ]),
    );
    assert_eq!(
        moved.results[0].partitions[0].error_code,
        code::CLUSTER_AUTHORIZATION_FAILED
    );

    let described = describe_topic_partitions(&mut conn, &[&topic], 10, None);
    assert_eq!(described.topics.len(), 1);
    assert_eq!(described.topics[0].error_code, code::TOPIC_AUTHORIZATION_FAILED);
    assert_eq!(
        describe_topic_partitions(&mut conn, &[], 10, None).topics.len(),
        0
    );
}

#[test]
fn two_gateways_accept_assignments_to_each_other_and_list_each_partition_once() {
    let redis = TestRedis::start();
    let a = Ketch::start_node(&redis.url(), 1, "600ms", &["--set", "topics.auto_create=false"]);
    let b = Ketch::start_node(&redis.url(), 2, "600ms", &["--set", "topics.auto_create=false"]);
    let rt = runtime();
    // Membership converges through heartbeats; Metadata shows when.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let brokers: BTreeSet<i32> = a
            .consumer()
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("metadata")
            .brokers()
            .iter()
            .map(|broker| broker.id())
            .collect();
        if brokers == BTreeSet::from([1, 2]) {
            break;
        }
        assert!(Instant::now() < deadline, "brokers {brokers:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let topic = unique_topic("spread");
    let assignment: &[&[i32]] = &[&[2], &[1], &[2], &[1], &[2], &[1], &[2], &[1]];
    let results = rt
        .block_on(a.admin().create_topics(
            [&NewTopic::new(&topic, 8, TopicReplication::Variable(assignment))],
            &admin_options(),
        ))
        .expect("CreateTopics");
    assert_eq!(
        results,
        vec![Ok(topic.clone())],
        "broker 2 named through broker 1"
    );
    assert_eq!(grow(&a, &rt, &topic, 10, &[&[2], &[2]]), Ok(topic.clone()));
    let (_, leaders) = metadata(&a, &topic);
    assert_eq!(leaders.len(), 10);

    // Each partition is listed by its leader alone, so sums over brokers count it once.
    let mut listed: BTreeMap<i32, i32> = BTreeMap::new();
    for (gateway, id) in [(&a, 1), (&b, 2)] {
        let mut conn = KafkaConn::connect(gateway.kafka_addr());
        let response = describe_log_dirs(&mut conn, 4, Some(&[(&topic, &(0..10).collect::<Vec<_>>())]));
        let (redis_dir, _) = dirs(&response);
        for partition in sizes(&response, &topic)[&redis_dir].keys() {
            assert!(
                listed.insert(*partition, id).is_none(),
                "partition {partition} listed twice"
            );
        }
    }
    let by_leader: BTreeMap<i32, i32> = leaders.iter().enumerate().map(|(p, l)| (p as i32, *l)).collect();
    assert_eq!(listed, by_leader, "each partition listed by its Metadata leader");

    // A reassignment to another live gateway is still refused.
    let mut conn = KafkaConn::connect(a.kafka_addr());
    let other = if leaders[0] == 1 { 2 } else { 1 };
    let response = reassign(&mut conn, 0, true, &[(&topic, 0, Some(&[other]))]);
    assert_eq!(
        response.responses[0].partitions[0].error_code,
        INVALID_REPLICA_ASSIGNMENT
    );
    for (version, allow) in [(0, true), (1, false)] {
        let response = reassign(
            &mut conn,
            version,
            allow,
            &[(&topic, 0, Some(&[leaders[0], other]))],
        );
        assert_eq!(
            response.responses[0].partitions[0].error_code, INVALID_REPLICATION_FACTOR,
            "version {version}"
        );
    }
}

#[test]
fn behind_a_load_balancer_the_one_advertised_broker_leads_everything() {
    let stack = Balanced::start(2, &["--set", "topics.auto_create=false"]);
    let [a, b] = &stack.gateways[..] else {
        panic!("two gateways")
    };
    let mut conn = KafkaConn::connect(a.kafka_addr());
    let cluster = conn.request(0, &DescribeClusterRequest::default());
    assert_eq!(cluster.brokers.len(), 1, "{cluster:?}");
    // A controller endpoint asked of a broker is a mismatch (as Kafka
    // answers an admin client given a broker as bootstrap.controllers);
    // an unknown type is unsupported.
    for (endpoint_type, error) in [(2, 114), (7, 115)] {
        let asked = DescribeClusterRequest::default().with_endpoint_type(endpoint_type);
        assert_eq!(
            conn.request(1, &asked).error_code,
            error,
            "endpoint type {endpoint_type}"
        );
    }
    let shared = *cluster.brokers[0].broker_id;

    // Assignments may name the one broker clients see, not a gateway's own id.
    let topic = unique_topic("balanced");
    let assign = |name: &str, broker: i32| {
        CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![
                CreatableTopic::default()
                    .with_name(topic_name(name))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(
                        (0..4)
                            .map(|p| {
                                CreatableReplicaAssignment::default()
                                    .with_partition_index(p)
                                    .with_broker_ids(vec![BrokerId(broker)])
                            })
                            .collect(),
                    ),
            ])
    };
    let created = conn.request(5, &assign(&topic, shared));
    assert_eq!(created.topics[0].error_code, code::NONE, "{created:?}");
    let own_id = unique_topic("own-id");
    let refused = conn.request(5, &assign(&own_id, 0));
    assert_eq!(refused.topics[0].error_code, INVALID_REPLICA_ASSIGNMENT);

    let (listed, _, _) = all_pages(&mut conn, &[&topic], 100);
    assert_eq!(listed.len(), 4);
    assert!(
        listed
            .iter()
            .all(|(_, _, leader, replicas)| *leader == shared && replicas == &vec![shared]),
        "{listed:?}"
    );
    // Whichever gateway a connection lands on is the one broker: it lists every partition.
    for gateway in [a, b] {
        let mut conn = KafkaConn::connect(gateway.kafka_addr());
        let response = describe_log_dirs(&mut conn, 4, Some(&[(&topic, &[0, 1, 2, 3])]));
        let (redis_dir, _) = dirs(&response);
        assert_eq!(sizes(&response, &topic)[&redis_dir].len(), 4);
        let reassigned = reassign(&mut conn, 0, true, &[(&topic, 0, Some(&[shared]))]);
        assert_eq!(reassigned.responses[0].partitions[0].error_code, code::NONE);
    }
}

fn raw_str(s: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.to_owned())
}

/// A CreatePartitions that cannot take the topic's growth lock in time
/// (another gateway's growth holds it) is REQUEST_TIMED_OUT with a message,
/// as Kafka's controller answers a request it could not finish in time,
/// not NOT_ENOUGH_REPLICAS; the topic keeps its partitions.
#[test]
fn a_growth_that_waits_out_anothers_lock_is_request_timed_out() {
    let (redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("growth-locked");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = raw::topic_id(&mut conn, &topic).expect("the topic's id");
    let _: () = redis::cmd("SET")
        .arg(format!("ketch:lock:partitions:{id}"))
        .arg("another gateway's growth")
        .arg("EX")
        .arg(60)
        .query(&mut redis.connection())
        .expect("SET");
    conn.set_read_timeout(Duration::from_secs(30));
    assert_eq!(
        raw::create_partitions(&mut conn, &topic, 2),
        code::REQUEST_TIMED_OUT
    );
    assert_eq!(redis.topic_tags(&topic).len(), 1);
}

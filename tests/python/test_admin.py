"""confluent-kafka AdminClient: CreateTopics (validate_only, errors, configs),
DescribeConfigs, CreatePartitions, DeleteTopics; and the replica and log
directory APIs of one logical replica per partition (DescribeLogDirs,
DescribeTopicPartitions, ElectLeaders, partition reassignments,
AlterReplicaLogDirs, manual assignments) through kafka-python's
KafkaAdminClient and confluent-kafka."""

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewPartitions, NewTopic
from confluent_kafka import ElectionType, Producer, TopicCollection, TopicPartition as ConfluentPartition
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartitionReplica
import kafka.errors


def admin_client(ketch):
    return AdminClient({"bootstrap.servers": ketch.bootstrap})


def topic_names(admin):
    # Metadata for all topics: never auto-creates.
    return set(admin.list_topics(timeout=10).topics)


def source_of(entry):
    # An int or a ConfigSource, depending on the client version.
    return ConfigSource(getattr(entry.source, "value", entry.source))


def error_code(future):
    with pytest.raises(KafkaException) as raised:
        future.result(15)
    return raised.value.args[0].code()


def test_create_validate_only_creates_nothing(ketch, topic_name):
    admin = admin_client(ketch)
    futures = admin.create_topics([NewTopic(topic_name, 2, 1)], validate_only=True)
    assert futures[topic_name].result(15) is None
    assert topic_name not in topic_names(admin)


def test_create_rejects_bad_requests_per_topic(ketch, topic_name):
    admin = admin_client(ketch)
    good, bad_rf, bad_config, bad_value = (f"{topic_name}-{s}" for s in ("good", "rf", "cfg", "val"))
    futures = admin.create_topics(
        [
            NewTopic(good, 1, 1),
            NewTopic(bad_rf, 1, replication_factor=3),
            NewTopic(bad_config, 1, 1, config={"no.such.config": "1"}),
            NewTopic(bad_value, 1, 1, config={"cleanup.policy": "forever"}),
        ]
    )
    assert futures[good].result(15) is None
    assert error_code(futures[bad_rf]) == KafkaError.INVALID_REPLICATION_FACTOR
    assert error_code(futures[bad_config]) == KafkaError.INVALID_CONFIG
    assert error_code(futures[bad_value]) == KafkaError.INVALID_CONFIG
    names = topic_names(admin)
    assert good in names
    assert not names & {bad_rf, bad_config, bad_value}

    again = admin.create_topics([NewTopic(good, 1, 1)])
    assert error_code(again[good]) == KafkaError.TOPIC_ALREADY_EXISTS


def test_describe_configs_reports_overrides_and_defaults(ketch, topic_name):
    admin = admin_client(ketch)
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"retention.ms": "3600000"})])[topic_name].result(15)

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([resource])[resource].result(15)

    retention = configs["retention.ms"]
    assert retention.value == "3600000"
    assert source_of(retention) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert not retention.is_default
    policy = configs["cleanup.policy"]
    assert policy.value == "delete"
    assert policy.is_default
    assert source_of(policy) == ConfigSource.DEFAULT_CONFIG
    assert "max.message.bytes" in configs


def test_create_partitions_then_delete_topic(ketch, topic_name):
    admin = admin_client(ketch)
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)

    admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(15)
    assert len(admin.list_topics(timeout=10).topics[topic_name].partitions) == 4

    admin.delete_topics([topic_name], operation_timeout=10)[topic_name].result(15)
    assert topic_name not in topic_names(admin)

    missing = admin.delete_topics([topic_name], operation_timeout=10)
    assert error_code(missing[topic_name]) == KafkaError.UNKNOWN_TOPIC_OR_PART


def create(ketch, topic, partitions):
    admin = admin_client(ketch)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def kafka_python_admin(ketch):
    return KafkaAdminClient(bootstrap_servers=ketch.bootstrap, request_timeout_ms=15000)


def produce_kib(ketch, topic, partition, count):
    producer = Producer({"bootstrap.servers": ketch.bootstrap, "linger.ms": 5})
    for _ in range(count):
        producer.produce(topic, value=b"v" * 1024, partition=partition)
    assert producer.flush(15) == 0


def test_kafka_python_describe_log_dirs_sizes_partitions_in_redis(ketch, topic_name):
    create(ketch, topic_name, 2)
    produce_kib(ketch, topic_name, 0, 200)
    admin = kafka_python_admin(ketch)
    try:
        brokers = admin.describe_log_dirs({topic_name: [0, 1]})
    finally:
        admin.close()
    assert [b["broker"] for b in brokers] == [ketch.node_id]
    log_dirs = brokers[0]["log_dirs"]
    assert len(log_dirs) == 2, log_dirs
    redis_dir, archive_dir = log_dirs
    assert redis_dir["error_code"] == 0
    assert redis_dir["log_dir"].startswith("redis://127.0.0.1:"), redis_dir
    assert archive_dir["log_dir"].startswith("file:///"), archive_dir
    (topic,) = [t for t in redis_dir["topics"] if t["name"] == topic_name]
    size = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
    assert size[0] >= 150_000, size  # 200 KiB of values
    assert size[1] < size[0], size
    assert archive_dir["topics"] == [], "no remote storage, nothing archived"


def test_kafka_python_describe_topic_partitions_pages_with_a_cursor(ketch, topic_name):
    create(ketch, topic_name, 3)
    admin = kafka_python_admin(ketch)
    try:
        first = admin.describe_topic_partitions([topic_name], response_partition_limit=2)
        second = admin.describe_topic_partitions(
            [topic_name], response_partition_limit=2, cursor=first["next_cursor"]
        )
        missing = admin.describe_topic_partitions([topic_name + "-missing"])
    finally:
        admin.close()
    assert first["next_cursor"] == {"topic_name": topic_name, "partition_index": 2}
    assert second["next_cursor"] is None
    partitions = first["topics"][0]["partitions"] + second["topics"][0]["partitions"]
    assert [p["partition_index"] for p in partitions] == [0, 1, 2]
    for p in partitions:
        assert p["leader_id"] == ketch.node_id
        assert p["replica_nodes"] == p["isr_nodes"] == [ketch.node_id]
    assert missing["topics"][0]["error_code"] == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_elections_reassignments_and_log_dir_moves_change_nothing(ketch, topic_name):
    create(ketch, topic_name, 2)
    admin = kafka_python_admin(ketch)
    try:
        election = admin.elect_leaders(0, {topic_name: [0, 1]})
        unknown = admin.elect_leaders(0, {topic_name + "-missing": [0]}, raise_errors=False)
        ongoing = admin.list_partition_reassignments()
        tp = TopicPartition(topic_name, 0)
        moved = admin.alter_partition_reassignments({tp: [ketch.node_id + 1]})
        cancelled = admin.alter_partition_reassignments({tp: None})
        unchanged = admin.alter_partition_reassignments({tp: [ketch.node_id]})
        log_dir = admin.alter_replica_log_dirs(
            {TopicPartitionReplica(topic_name, 0, ketch.node_id): "/var/lib/kafka/data"}
        )
    finally:
        admin.close()
    codes = {
        (r.topic, p.partition_id): p.error_code
        for r in election.replica_election_results
        for p in r.partition_result
    }
    assert codes == {(topic_name, 0): 84, (topic_name, 1): 84}  # ELECTION_NOT_NEEDED
    assert [p.error_code for r in unknown.replica_election_results for p in r.partition_result] == [
        KafkaError.UNKNOWN_TOPIC_OR_PART
    ]
    assert ongoing == {}
    assert moved == {tp: kafka.errors.InvalidReplicationAssignmentError}
    assert cancelled == {tp: kafka.errors.NoReassignmentInProgressError}
    assert unchanged == {tp: None}
    assert list(log_dir.values()) == [kafka.errors.LogDirNotFoundError]


def test_confluent_kafka_elect_leaders_and_describe_topics(ketch, topic_name):
    admin = admin_client(ketch)
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    results = admin.elect_leaders(
        ElectionType.PREFERRED, [ConfluentPartition(topic_name, 0), ConfluentPartition(topic_name, 1)]
    ).result(15)
    assert len(results) == 2
    for partition, error in results.items():
        assert error is not None, partition
        assert error.code() == KafkaError.ELECTION_NOT_NEEDED

    description = admin.describe_topics(TopicCollection([topic_name]))[topic_name].result(15)
    assert [p.id for p in description.partitions] == [0, 1]
    for p in description.partitions:
        assert p.leader.id == ketch.node_id
        assert [r.id for r in p.replicas] == [r.id for r in p.isr] == [ketch.node_id]


def test_confluent_kafka_replica_assignments_name_a_live_broker(ketch, topic_name):
    admin = admin_client(ketch)
    assigned, stray = f"{topic_name}-assigned", f"{topic_name}-stray"
    futures = admin.create_topics(
        [
            # librdkafka wants the count with an assignment (it sends -1).
            NewTopic(assigned, 2, replica_assignment=[[ketch.node_id], [ketch.node_id]]),
            NewTopic(stray, 1, replica_assignment=[[ketch.node_id + 7]]),
        ]
    )
    assert futures[assigned].result(15) is None
    assert error_code(futures[stray]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    names = topic_names(admin)
    assert assigned in names
    assert stray not in names

    grow = admin.create_partitions([NewPartitions(assigned, 3, replica_assignment=[[ketch.node_id + 7]])])
    assert error_code(grow[assigned]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    admin.create_partitions([NewPartitions(assigned, 3, replica_assignment=[[ketch.node_id]])])[assigned].result(15)
    assert len(admin.list_topics(timeout=10).topics[assigned].partitions) == 3

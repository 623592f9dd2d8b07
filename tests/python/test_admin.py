"""confluent-kafka AdminClient: CreateTopics (validate_only, errors, configs),
DescribeConfigs, CreatePartitions, DeleteTopics."""

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewPartitions, NewTopic


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
            NewTopic(bad_value, 1, 1, config={"cleanup.policy": "compact"}),
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

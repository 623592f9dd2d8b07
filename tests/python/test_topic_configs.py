"""Topic configs through both Python admin clients: Kafka Connect's
internal-topic configs accepted at creation, IncrementalAlterConfigs
(confluent-kafka) and AlterConfigs / IncrementalAlterConfigs (kafka-python)
through one gateway, seen by a second; invalid values refused; the
CreateTime timestamp bound as a producer sees it."""

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)


def config_value(admin, topic, name):
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(15)
    return configs[name].value


def eventually_value(admin, topic, name, want, timeout=5.0):
    """The value as `admin`'s gateway describes it, asked until it is `want`;
    returns the seconds it took."""
    start = time.monotonic()
    while True:
        got = config_value(admin, topic, name)
        if got == want:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{name}: {got}, want {want}"
        time.sleep(0.05)


def test_provisioning_configs_are_accepted_at_creation(ketch, topic_name):
    """What Strimzi, Terraform and Kafka Connect's own topic creation send."""
    admin = AdminClient({"bootstrap.servers": ketch.bootstrap})
    configs = {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "index.interval.bytes": "4096",
        "segment.index.bytes": "10485760",
        "flush.messages": "10000",
        "message.timestamp.after.max.ms": "86400000",
        "retention.ms": "604800000",
        "preallocate": "false",
    }
    futures = admin.create_topics([NewTopic(topic_name, 3, 1, config=configs)])
    futures[topic_name].result(15)
    for name, value in configs.items():
        assert config_value(admin, topic_name, name) == value, name


def test_confluent_incremental_alter_is_seen_by_a_second_gateway(ketch_cluster, topic_name):
    a, b = ketch_cluster(2)
    on_a = AdminClient({"bootstrap.servers": a.bootstrap})
    on_b = AdminClient({"bootstrap.servers": b.bootstrap})
    on_a.create_topics([NewTopic(topic_name, 1, 1, config={"retention.ms": "1000"})])[topic_name].result(15)
    assert config_value(on_b, topic_name, "retention.ms") == "1000"

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic_name,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("min.insync.replicas", "2", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    on_a.incremental_alter_configs([resource])[resource].result(15)
    took = eventually_value(on_b, topic_name, "retention.ms", "7200000")
    assert took < 2.0, f"the second gateway saw the change after {took:.2f} s"
    assert config_value(on_b, topic_name, "min.insync.replicas") == "2"

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic_name,
        incremental_configs=[ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)],
    )
    on_b.incremental_alter_configs([resource])[resource].result(15)
    eventually_value(on_a, topic_name, "retention.ms", "604800000")

    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic_name,
        incremental_configs=[ConfigEntry("retention.ms", "-7", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as raised:
        on_a.incremental_alter_configs([bad])[bad].result(15)
    assert raised.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "retention.ms" in raised.value.args[0].str()
    assert config_value(on_a, topic_name, "min.insync.replicas") == "2"


def test_kafka_python_alters_configs_both_ways(ketch_cluster, topic_name):
    from kafka.admin import AlterConfigOp, ConfigResource as KConfigResource, ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic

    a, b = ketch_cluster(2)
    on_a = KafkaAdminClient(bootstrap_servers=a.bootstrap)
    on_b = AdminClient({"bootstrap.servers": b.bootstrap})
    try:
        on_a.create_topics([KNewTopic(topic_name, 1, 1, topic_configs={"segment.ms": "60000"})])
        # IncrementalAlterConfigs (kafka-python's choice when offered).
        on_a.alter_configs(
            [KConfigResource(ConfigResourceType.TOPIC, topic_name, configs={"max.message.bytes": (AlterConfigOp.SET, "65536")})]
        )
        eventually_value(on_b, topic_name, "max.message.bytes", "65536")
        assert config_value(on_b, topic_name, "segment.ms") == "60000", "incremental keeps other overrides"
        # Legacy AlterConfigs replaces every override; kafka-python sends the
        # overrides it read back with the new one, so they stay.
        on_a.alter_configs(
            [KConfigResource(ConfigResourceType.TOPIC, topic_name, configs={"retention.bytes": "1048576"})],
            incremental=False,
        )
        eventually_value(on_b, topic_name, "retention.bytes", "1048576")
        assert config_value(on_b, topic_name, "segment.ms") == "60000"
        assert config_value(on_b, topic_name, "max.message.bytes") == "65536"
    finally:
        on_a.close()


def test_a_record_too_far_ahead_fails_in_the_producer(ketch, topic_name):
    admin = AdminClient({"bootstrap.servers": ketch.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    producer = Producer({"bootstrap.servers": ketch.bootstrap, "linger.ms": 0})
    reports = []
    now = int(time.time() * 1000)
    # One batch each: a batch is refused whole.
    producer.produce(topic_name, b"two hours ahead", timestamp=now + 2 * 3600 * 1000, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(15) == 0
    producer.produce(topic_name, b"now", timestamp=now, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(15) == 0
    assert reports[0] is not None and reports[0].code() == KafkaError.INVALID_TIMESTAMP, reports
    assert reports[1] is None, reports

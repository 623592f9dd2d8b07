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
    ConfigSource,
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


def alter_cluster_defaults(admin, *edits):
    """IncrementalAlterConfigs on the default broker resource (what
    kafka-configs.sh --entity-type brokers --entity-default sends; neither
    Python admin client names that resource, so kafka-python's own protocol
    class is sent); (error code, message)."""
    from kafka.protocol.admin import IncrementalAlterConfigsRequest

    request = IncrementalAlterConfigsRequest(resources=[(4, "", list(edits))], validate_only=False)
    response = admin._manager.run(admin._manager.send, request)
    [result] = response.responses
    return result.error_code, result.error_message


def test_cluster_wide_defaults_apply_on_every_gateway(ketch_cluster, topic_name):
    """Set through one gateway, in effect for a topic without overrides on
    the other, described with its source by confluent-kafka, removed."""
    from kafka.admin import KafkaAdminClient

    a, b = ketch_cluster(2)
    on_a = KafkaAdminClient(bootstrap_servers=a.bootstrap)
    on_b = AdminClient({"bootstrap.servers": b.bootstrap})
    try:
        on_b.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
        assert alter_cluster_defaults(
            on_a, ("log.retention.ms", 0, "3600000"), ("log.cleanup.policy", 2, "compact")
        ) == (0, None)
        took = eventually_value(on_b, topic_name, "retention.ms", "3600000")
        assert took < 2.0, f"the second gateway saw the change after {took:.2f} s"
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
        configs = on_b.describe_configs([resource])[resource].result(15)
        assert configs["retention.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        assert configs["cleanup.policy"].value == "delete,compact"

        # A record without a key is now refused: the topic compacts by default.
        producer = Producer({"bootstrap.servers": b.bootstrap})
        failures = []
        producer.produce(topic_name, value=b"no key", on_delivery=lambda err, _msg: failures.append(err))
        producer.flush(15)
        assert failures and failures[0] is not None and failures[0].code() == KafkaError.INVALID_RECORD

        # A value the topic config would refuse, refused under its broker name
        # (INVALID_REQUEST, as Kafka refuses a broker config's value).
        code, message = alter_cluster_defaults(on_a, ("log.retention.ms", 0, "-7"))
        assert code == KafkaError.INVALID_REQUEST and "log.retention.ms" in message, message
        # One broker alone is refused with the reason, as confluent-kafka shows it.
        broker = ConfigResource(
            ConfigResource.Type.BROKER,
            "1",
            incremental_configs=[ConfigEntry("log.retention.ms", "1", incremental_operation=AlterConfigOpType.SET)],
        )
        with pytest.raises(KafkaException) as raised:
            on_b.incremental_alter_configs([broker])[broker].result(15)
        assert "topic defaults are cluster-wide" in raised.value.args[0].str()

        assert alter_cluster_defaults(on_a, ("log.retention.ms", 1, None), ("log.cleanup.policy", 1, None)) == (
            0,
            None,
        )
        eventually_value(on_b, topic_name, "retention.ms", "604800000")
        configs = on_b.describe_configs([resource])[resource].result(15)
        assert configs["cleanup.policy"].value == "delete"
        assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    finally:
        on_a.close()

"""Log compaction as Kafka Connect uses it, without Java: the three internal
topics created with Connect's configs, keyed records and tombstones written
with confluent-kafka, compaction by the storage worker, and the latest value
per key read back from the start, with offsets and tombstone expiry checked.
Records without a key are refused per record (librdkafka and kafka-python)."""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

# Connect's distributed worker creates these (cleanup.policy=compact; the
# offsets topic with 25 partitions, status with 5, config with 1).
CONNECT_TOPICS = {"connect-configs": 1, "connect-offsets": 25, "connect-status": 5}
FAST = ("tiering.tick_interval=50ms",)


def read_from_start(bootstrap, topic, partitions):
    """Every record of `topic` from offset 0 to each partition's high
    watermark: {partition: [(offset, key, value)]}."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "check.crcs": True})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        seen = {p: [] for p in range(partitions)}
        position = {p: 0 for p in range(partitions)}
        # A reader is never stuck below a high watermark (the last batch
        # of a log is never compacted away), but compaction may run
        # meanwhile: reading stops at the high watermarks or after a second
        # without records.
        idle_since = time.monotonic()
        while any(position[p] < ends[p] for p in range(partitions)) and time.monotonic() - idle_since < 1.0:
            message = consumer.poll(0.1)
            if message is None:
                continue
            idle_since = time.monotonic()
            assert message.error() is None, message.error()
            p = message.partition()
            seen[p].append((message.offset(), message.key(), message.value()))
            position[p] = message.offset() + 1
        return seen
    finally:
        consumer.close()


def compacted_view(written):
    """What a reader must see once all is compacted: per partition, each key's
    latest (offset, key, value), in offset order."""
    latest = {}
    for partition, offset, key, value in written:
        latest[(partition, key)] = (offset, key, value)
    view = {}
    for (partition, _), record in latest.items():
        view.setdefault(partition, []).append(record)
    return {p: sorted(records) for p, records in view.items()}


def eventually_read(bootstrap, topic, partitions, want, timeout=30.0):
    """Reads `topic` from the start until its non-empty partitions hold
    `want` (compaction runs in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = read_from_start(bootstrap, topic, partitions)
        if {p: r for p, r in seen.items() if r} == want:
            return
        assert time.monotonic() < deadline, f"{topic}: {seen} want {want}"
        time.sleep(0.2)


def test_connect_internal_topics_compact_to_the_latest_value_per_key(ketch_cluster):
    (gateway,) = ketch_cluster(1, settings=FAST)
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    configs = {"cleanup.policy": "compact", "segment.ms": "200", "min.cleanable.dirty.ratio": "0",
               "delete.retention.ms": "3000"}
    futures = admin.create_topics([NewTopic(t, n, 1, config=configs) for t, n in CONNECT_TOPICS.items()])
    for future in futures.values():
        future.result(15)

    producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    written = {topic: [] for topic in CONNECT_TOPICS}

    def delivered(topic):
        def report(error, message):
            assert error is None, error
            written[topic].append((message.partition(), message.offset(), message.key(), message.value()))
        return report

    # Connectors' configs, offsets and task statuses, rewritten many times;
    # then tombstones for a removed connector's keys.
    for version in range(20):
        for connector in range(10):
            key = f"connector-{connector}".encode()
            for topic in CONNECT_TOPICS:
                producer.produce(topic, value=f'{{"v": {version}}}'.encode(), key=key,
                                 partition=connector % CONNECT_TOPICS[topic], on_delivery=delivered(topic))
        producer.flush(15)
    for topic in CONNECT_TOPICS:
        producer.produce(topic, value=None, key=b"connector-3", partition=3 % CONNECT_TOPICS[topic],
                         on_delivery=delivered(topic))
    assert producer.flush(15) == 0

    for topic, partitions in CONNECT_TOPICS.items():
        want = compacted_view(written[topic])
        eventually_read(gateway.bootstrap, topic, partitions, want)
        # Offsets are the ones the producer was given, and the tombstone is
        # there for readers that start now.
        assert any(value is None for records in want.values() for _, _, value in records)

    # After delete.retention.ms the tombstones go, and a record written
    # meanwhile after them stays. (The last batch of a partition's log
    # stays whatever it holds, as Kafka's active segment does: the record
    # after the tombstone is what lets it go.)
    for topic in CONNECT_TOPICS:
        producer.produce(topic, value=b"later", key=b"connector-9", partition=3 % CONNECT_TOPICS[topic],
                         on_delivery=delivered(topic))
    assert producer.flush(15) == 0
    for topic, partitions in CONNECT_TOPICS.items():
        want = {p: [r for r in records if r[2] is not None]
                for p, records in compacted_view(written[topic]).items()}
        want = {p: r for p, r in want.items() if r}
        eventually_read(gateway.bootstrap, topic, partitions, want)


def test_a_record_without_a_key_fails_per_record_in_both_clients(ketch, topic_name):
    admin = AdminClient({"bootstrap.servers": ketch.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": "compact"})])[topic_name].result(15)

    reports = []
    producer = Producer({"bootstrap.servers": ketch.bootstrap, "linger.ms": 0})
    producer.produce(topic_name, value=b"no key", on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(15) == 0
    producer.produce(topic_name, value=b"keyed", key=b"k", on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(15) == 0
    assert reports[0] is not None and reports[0].code() == KafkaError.INVALID_RECORD, reports
    assert reports[1] is None, reports

    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    kp = KafkaProducer(bootstrap_servers=ketch.bootstrap, retries=0)
    try:
        with pytest.raises(InvalidRecordError):
            kp.send(topic_name, value=b"no key").get(timeout=15)
        assert kp.send(topic_name, value=b"keyed", key=b"k2").get(timeout=15).offset == 1
    finally:
        kp.close()

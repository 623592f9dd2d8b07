"""kafka-python producer -> ketch -> consumer.

kafka-python picks its protocol versions by probing the broker with
ApiVersions (api_version=None, the default); these tests keep that so they
check ketch's ApiVersions answer too. The consumer reads with assign() and
seek(); consumer groups are covered in test_groups.py.
"""

import dataclasses
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from helpers import BASE_TIMESTAMP_MS, by_partition, make_records

PARTITIONS = 3
COUNT = 2_000


def kafka_python_records(count, partitions):
    # KafkaProducer.send() accepts only bytes header values, not None.
    return [
        dataclasses.replace(r, headers=tuple((k, b"" if v is None else v) for k, v in r.headers))
        for r in make_records(count, partitions)
    ]


def test_round_trip_is_byte_identical_with_dense_offsets(ketch, topic_name):
    records = kafka_python_records(COUNT, PARTITIONS)
    admin = KafkaAdminClient(bootstrap_servers=ketch.bootstrap)
    try:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=ketch.bootstrap, acks=1, linger_ms=5)
    futures = [
        producer.send(
            topic_name,
            value=r.value,
            key=r.key,
            headers=list(r.headers),
            partition=r.partition,
            timestamp_ms=r.timestamp_ms,
        )
        for r in records
    ]
    producer.flush(30)
    metadata = [f.get(timeout=30) for f in futures]
    producer.close()

    expected = by_partition(records, PARTITIONS)
    for p in range(PARTITIONS):
        acked = sorted(m.offset for m in metadata if m.partition == p)
        assert acked == list(range(len(expected[p]))), f"partition {p}: acknowledged offsets not dense"

    consumer = KafkaConsumer(
        bootstrap_servers=ketch.bootstrap,
        group_id=None,
        enable_auto_commit=False,
    )
    partitions = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    for tp in partitions:
        consumer.seek(tp, 0)
    got = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    try:
        while any(len(got[p]) < len(expected[p]) for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
            for tp, batch in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend(batch)
    finally:
        consumer.close()

    for p in range(PARTITIONS):
        messages = got[p]
        assert [m.offset for m in messages] == list(range(len(expected[p]))), f"partition {p}"
        for want, msg in zip(expected[p], messages):
            where = f"partition {p} offset {msg.offset}"
            assert msg.key == want.key, where
            assert msg.value == want.value, where
            assert tuple(msg.headers) == want.headers, where
            assert msg.timestamp == want.timestamp_ms, where
            assert msg.timestamp_type == 0, where  # CreateTime


def test_offsets_for_times_and_end_offsets(ketch, topic_name):
    producer = KafkaProducer(bootstrap_servers=ketch.bootstrap, acks=1)
    base = BASE_TIMESTAMP_MS
    for i in range(10):
        producer.send(topic_name, value=b"v%d" % i, partition=0, timestamp_ms=base + i * 1000)
    producer.flush(30)
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=ketch.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic_name, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: base + 4500})
        assert found[tp].offset == 5 and found[tp].timestamp == base + 5000
        assert consumer.offsets_for_times({tp: base + 99_000})[tp] is None
    finally:
        consumer.close()


def test_idempotent_producer_works_unchanged(ketch, topic_name):
    """kafka-python's idempotent producer (InitProducerId, sequences), as the
    Java client uses by default: every record stored once, offsets dense."""
    admin = KafkaAdminClient(bootstrap_servers=ketch.bootstrap)
    try:
        admin.create_topics([NewTopic(topic_name, 2, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=ketch.bootstrap, enable_idempotence=True, acks="all")
    futures = [producer.send(topic_name, value=b"v%d" % i, partition=i % 2) for i in range(1000)]
    producer.flush(30)
    metadata = [f.get(timeout=30) for f in futures]
    producer.close()
    for p in range(2):
        offsets = sorted(m.offset for m in metadata if m.partition == p)
        assert offsets == list(range(500)), f"partition {p}: {offsets[:5]}..."

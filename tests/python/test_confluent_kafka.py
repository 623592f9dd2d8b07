"""confluent-kafka (librdkafka) producer -> ketch -> consumer.

The consumer reads with assign() and explicit offsets and never commits,
so these tests check the data path alone; consumer groups are covered in
test_groups.py.
"""

import time

from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from helpers import by_partition, make_records

PARTITIONS = 3
COUNT = 2_000


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)
    futures[name].result(15)


def produce(bootstrap, topic, records, **config):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    reports = []

    def on_delivery(err, msg):
        # A Message with an empty value is falsy (it has a length): test for None.
        reports.append((err, msg.partition(), msg.offset()) if msg is not None else (err, None, None))

    for r in records:
        while True:
            try:
                producer.produce(
                    topic,
                    value=r.value,
                    key=r.key,
                    partition=r.partition,
                    timestamp=r.timestamp_ms,
                    headers=list(r.headers),
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered"
    errors = [e for e, _, _ in reports if e is not None]
    assert not errors, f"delivery errors: {errors[:5]}"
    assert len(reports) == len(records)
    return reports


def consume(bootstrap, topic, expected_counts, timeout=60):
    """Reads every partition from offset 0 up to its expected count."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # Required by the client; never used: no subscribe(), no commits.
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in expected_counts])
    got = {p: [] for p in expected_counts}
    deadline = time.monotonic() + timeout
    try:
        while any(len(got[p]) < n for p, n in expected_counts.items()):
            assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                continue
            got[msg.partition()].append(msg)
    finally:
        consumer.close()
    return got


def test_round_trip_is_byte_identical_with_dense_offsets(ketch, topic_name):
    records = make_records(COUNT, PARTITIONS)
    create_topic(ketch.bootstrap, topic_name, PARTITIONS)

    reports = produce(ketch.bootstrap, topic_name, records)

    expected = by_partition(records, PARTITIONS)
    for p in range(PARTITIONS):
        acked = sorted(o for _, part, o in reports if part == p)
        assert acked == list(range(len(expected[p]))), f"partition {p}: acknowledged offsets not dense"

    got = consume(ketch.bootstrap, topic_name, {p: len(v) for p, v in expected.items()})
    for p in range(PARTITIONS):
        messages = got[p]
        assert [m.offset() for m in messages] == list(range(len(expected[p]))), f"partition {p}"
        for want, msg in zip(expected[p], messages):
            where = f"partition {p} offset {msg.offset()}"
            assert msg.key() == want.key, where
            assert msg.value() == want.value, where
            assert tuple(msg.headers() or ()) == want.headers, where
            assert msg.timestamp() == (TIMESTAMP_CREATE_TIME, want.timestamp_ms), where


def test_compressed_batches_round_trip(ketch, topic_name):
    records = make_records(300, 1)
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        topic = f"{topic_name}-{codec}"
        create_topic(ketch.bootstrap, topic, 1)
        produce(ketch.bootstrap, topic, records, **{"compression.type": codec})
        messages = consume(ketch.bootstrap, topic, {0: len(records)})[0]
        assert [m.offset() for m in messages] == list(range(len(records))), codec
        for want, msg in zip(records, messages):
            assert (msg.key(), msg.value(), tuple(msg.headers() or ())) == (
                want.key,
                want.value,
                want.headers,
            ), f"{codec} offset {msg.offset()}"


def test_fetch_waits_for_records_produced_later(ketch, topic_name):
    create_topic(ketch.bootstrap, topic_name, 1)
    consumer = Consumer(
        {
            "bootstrap.servers": ketch.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5000,
        }
    )
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    try:
        # Let the consumer park in a long-poll fetch on the empty partition.
        assert consumer.poll(1.0) is None
        producer = Producer({"bootstrap.servers": ketch.bootstrap})
        producer.produce(topic_name, value=b"late", partition=0)
        assert producer.flush(10) == 0
        deadline = time.monotonic() + 10
        msg = None
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
        assert msg is not None and msg.error() is None, msg and msg.error()
        assert (msg.offset(), msg.value()) == (0, b"late")
    finally:
        consumer.close()

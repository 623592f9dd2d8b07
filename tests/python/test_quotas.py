"""Client quotas through the clients' own code: AlterClientQuotas and
DescribeClientQuotas as kafka-python encodes them (its protocol classes;
kafka-configs.sh sends the same requests), and librdkafka producers and
consumers (confluent-kafka) over their byte rate, and a producer over its
request_percentage, which see the gateway's throttle time in their
throttle callback and still deliver and read every record. Two gateways: the quota is set through one and enforced by the
other. Rates are measured over two 1 s samples, so a client may send one
second's worth of its quota before it is throttled."""

import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import AlterClientQuotasRequest, DescribeClientQuotasRequest

from conftest import FAST_GROUP_SETTINGS

SETTINGS = FAST_GROUP_SETTINGS + ("quotas.window_num=2", "quotas.window_size=1s")
RATE = 100_000  # bytes per second
VALUE = b"q" * 1000


def send(admin, request):
    return admin._manager.run(admin._manager.send, request)


def set_quota(admin, entity, key, value):
    request = AlterClientQuotasRequest(entries=[(entity, [(key, float(value), False)])], validate_only=False)
    response = send(admin, request)
    assert [(e.error_code, e.error_message) for e in response.entries] == [(0, None)]


def describe(admin, components, strict=False):
    response = send(admin, DescribeClientQuotasRequest(components=components, strict=strict))
    assert response.error_code == 0, response.error_message
    return [
        (sorted((p.entity_type, p.entity_name) for p in entry.entity), {v.key: v.value for v in entry.values})
        for entry in response.entries
    ]


def create_topic(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)


def test_quotas_set_with_kafka_python_are_described_by_every_gateway(ketch_cluster):
    a, b = ketch_cluster(2, settings=SETTINGS)
    on_a = KafkaAdminClient(bootstrap_servers=a.bootstrap)
    on_b = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        set_quota(on_a, [("user", "alice"), ("client-id", None)], "producer_byte_rate", 2048)
        invalid = AlterClientQuotasRequest(
            entries=[([("user", "bob")], [("producer_byte_rate", 10.5, False)])], validate_only=False
        )
        [entry] = send(on_a, invalid).entries
        assert entry.error_code == 42  # INVALID_REQUEST
        assert "fractional" in entry.error_message
        assert describe(on_b, [("user", 0, "alice")]) == [
            ([("client-id", None), ("user", "alice")], {"producer_byte_rate": 2048.0})
        ]
        assert describe(on_b, [("user", 0, "bob")]) == []
        # A filter on the user alone, strict: alice's entity names a client id too.
        assert describe(on_b, [("user", 0, "alice")], strict=True) == []
    finally:
        on_a.close()
        on_b.close()


def test_librdkafka_clients_over_their_quota_are_throttled_and_lose_nothing(ketch_cluster, topic_name):
    a, b = ketch_cluster(2, settings=SETTINGS)
    create_topic(a.bootstrap, topic_name)
    admin = KafkaAdminClient(bootstrap_servers=a.bootstrap)
    try:
        set_quota(admin, [("client-id", "slow-writer")], "producer_byte_rate", RATE)
        set_quota(admin, [("client-id", "slow-reader")], "consumer_byte_rate", RATE)
    finally:
        admin.close()

    # B learns of the quota at once (announced), but wait for it to apply:
    # a first burst is allowed anyway (one window's worth).
    count = 400  # 400 kB at 100 kB/s: about 3 s after the burst
    throttles, took = produce_throttled(
        b.bootstrap,
        topic_name,
        count,
        # Many requests, not one of 400 kB (a request is counted whole,
        # after it is stored).
        {"client.id": "slow-writer", "linger.ms": 5, "batch.size": 16384},
    )
    assert throttles, "no throttle event at 4x the quota"
    assert max(throttles) > 0
    # 300 kB past the burst at 100 kB/s cannot take much under 3 s.
    assert took > 1.5, f"{count} kB at {RATE} B/s in {took:.1f} s"
    print(f"produced {count} kB in {took:.1f} s, {len(throttles)} throttle events, longest {max(throttles):.3f} s")

    read_throttles = []
    keys = read_keys(
        b.bootstrap,
        topic_name,
        count,
        {
            "client.id": "slow-reader",
            "throttle_cb": lambda event: read_throttles.append(event.throttle_time),
        },
    )
    assert keys == list(range(count)), "every record once, in order"
    assert read_throttles and max(read_throttles) > 0, "no throttle event reading at 4x the quota"


def produce_throttled(bootstrap, topic, count, config):
    """Produces `count` records keyed 0.. with a librdkafka producer of
    `config`, checks every one was delivered once, in order; the throttle
    times its throttle callback saw, and the seconds it took."""
    throttles = []
    delivered = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
            **config,
        }
    )
    started = time.monotonic()
    for i in range(count):
        producer.produce(topic, VALUE, key=str(i).encode(), on_delivery=lambda e, m: delivered.append((e, m)))
        producer.poll(0)
    assert producer.flush(60) == 0
    took = time.monotonic() - started
    assert [e for e, _ in delivered if e is not None] == []
    assert [int(m.key()) for _, m in delivered] == list(range(count))
    return throttles, took


def read_keys(bootstrap, topic, count, config=None):
    """The keys (as numbers) a new consumer group reads from the start of
    `topic`, up to `count` of them or 60 s."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-readers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **(config or {}),
        }
    )
    try:
        consumer.subscribe([topic])
        keys = []
        deadline = time.monotonic() + 60
        while len(keys) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            keys.append(int(message.key()))
        return keys
    finally:
        consumer.close()


def test_librdkafka_producer_over_its_request_percentage_is_throttled_and_loses_nothing(ketch_cluster, topic_name):
    """request_percentage: the thread time a client's requests take. A
    producer sending small batches back to back at 1 % of a thread is
    throttled (throttle_cb) and every record is stored once, in order."""
    (ketch,) = ketch_cluster(1, settings=SETTINGS)
    create_topic(ketch.bootstrap, topic_name)
    admin = KafkaAdminClient(bootstrap_servers=ketch.bootstrap)
    try:
        set_quota(admin, [("client-id", "busy-writer")], "request_percentage", 1)
    finally:
        admin.close()
    count = 200
    throttles, took = produce_throttled(
        ketch.bootstrap,
        topic_name,
        count,
        # A request per record or two: many requests.
        {"client.id": "busy-writer", "linger.ms": 0, "batch.size": 2048},
    )
    assert throttles and max(throttles) > 0, "no throttle event at 1 % of a thread"
    print(f"produced {count} in {took:.1f} s; {len(throttles)} throttle events, longest {max(throttles):.3f} s")

    assert read_keys(ketch.bootstrap, topic_name, count) == list(range(count)), "every record once, in order"

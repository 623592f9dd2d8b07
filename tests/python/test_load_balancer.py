"""Clients through a TCP load balancer (HAProxy) in front of two gateways
started without node ids, both advertising the load balancer: the client
sees one broker; a two-member kafka-python consumer group works whichever
gateway each of its connections lands on (group requests are forwarded to
the group's coordinator), and so do confluent-kafka's transactions
(their state is in Redis, so any gateway serves them)."""

import collections
import re
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import confluent_kafka
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import CommitFailedError, RebalanceInProgressError

from conftest import FAST_GROUP_SETTINGS, start_ketch, stop_ketch

PARTITIONS = 4
COUNT = 400


@pytest.fixture
def behind_lb(load_balanced):
    """The load balancer's address."""
    return load_balanced[0]


@pytest.fixture
def load_balanced(redis_url):
    """Two gateways behind HAProxy; yields the load balancer's address and
    the gateways."""
    # The load balancer's port stays bound until HAProxy takes it, so no
    # gateway listener is given it meanwhile.
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))
    port = reserved.getsockname()[1]
    gateways = []
    haproxy = None
    workdir = tempfile.TemporaryDirectory()
    try:
        for _ in range(2):
            gateways.append(start_ketch(redis_url, settings=FAST_GROUP_SETTINGS, advertised_port=port))
        config = (
            "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 5m\n    timeout server 5m\n"
            f"frontend kafka\n    bind 127.0.0.1:{port}\n    default_backend gateways\n"
            "backend gateways\n    balance roundrobin\n"
        )
        for i, g in enumerate(gateways):
            config += f"    server g{i} {g.bootstrap} check inter 200ms\n"
        path = f"{workdir.name}/haproxy.cfg"
        with open(path, "w") as f:
            f.write(config)
        reserved.close()
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "haproxy does not accept"
                time.sleep(0.02)
        yield f"127.0.0.1:{port}", gateways
    finally:
        reserved.close()
        if haproxy is not None:
            haproxy.kill()
            haproxy.wait()
        errors = [e for e in map(stop_ketch, gateways) if e is not None]
        workdir.cleanup()
        assert not errors, errors


def test_a_kafka_python_group_behind_a_load_balancer_sees_one_broker_and_shares_the_partitions(
    behind_lb, topic_name
):
    admin = KafkaAdminClient(bootstrap_servers=behind_lb)
    try:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=behind_lb, acks="all", linger_ms=5)
    for i in range(COUNT):
        producer.send(topic_name, value=f"v{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    producer.close()

    group = f"{topic_name}-group"
    # Each member polls on its own thread, as an application's would: a
    # member parked in a rebalance must not keep the other from rejoining.
    seen = set()
    assigned = [0, 0]
    brokers = []
    stop = threading.Event()
    lock = threading.Lock()

    def member(i):
        consumer = KafkaConsumer(
            topic_name,
            bootstrap_servers=behind_lb,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            # The rebalance timeout: a member that polls late is not waited for long.
            max_poll_interval_ms=6000,
        )
        try:
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=200).values():
                    with lock:
                        seen.update(r.value for r in records)
                try:
                    consumer.commit()
                except (CommitFailedError, RebalanceInProgressError):
                    pass  # the group is rebalancing: the next poll rejoins
                assigned[i] = len(consumer.assignment())
            consumer.commit()
            if i == 0:
                brokers.extend(consumer._client.cluster.brokers())
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 90
        while True:
            with lock:
                done = len(seen) == COUNT
            if done and sorted(assigned) == [2, 2]:
                break
            assert time.monotonic() < deadline, f"consumed {len(seen)} of {COUNT}; assignments {assigned}"
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert seen == {f"v{i}".encode() for i in range(COUNT)}

    # One broker: the load balancer, under an address id (no gateway's own).
    host, port = behind_lb.split(":")
    assert [(b.host, b.port) for b in brokers] == [(host, int(port))]
    assert all(getattr(b, "node_id", getattr(b, "nodeId", None)) >= 2**30 for b in brokers)

    # The commits, read through the load balancer, reach every partition's end.
    reader = KafkaConsumer(bootstrap_servers=behind_lb, group_id=group, enable_auto_commit=False)
    try:
        committed = {p: reader.committed(TopicPartition(topic_name, p)) for p in range(PARTITIONS)}
    finally:
        reader.close()
    assert committed == {p: COUNT // PARTITIONS for p in range(PARTITIONS)}


def requests_served(gateway, api):
    """ketch_requests_total{api} of one gateway."""
    with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'^ketch_requests_total\{api="%s"\} (\S+)$' % api, text, re.M)
    return float(found.group(1)) if found else 0.0


def test_transactions_behind_a_load_balancer_work_on_whichever_gateway_a_request_lands(load_balanced, topic_name):
    """Consume-transform-produce through the load balancer: each batch of
    the input is copied to the output in one transaction with the group's
    offsets (send_offsets_to_transaction), by a new instance of the
    transactional producer each time (the new instance fences the last),
    so the transactions' requests land on both gateways; one more
    transaction is aborted. read_committed readers see every input record
    exactly once and nothing aborted, and the group's offsets reach the
    input's end."""
    address, gateways = load_balanced
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    admin = AdminClient({"bootstrap.servers": address})
    for name in (source, sink):
        admin.create_topics([confluent_kafka.admin.NewTopic(name, PARTITIONS, 1)])[name].result(15)
    plain = confluent_kafka.Producer({"bootstrap.servers": address, "linger.ms": 5})
    for i in range(COUNT):
        plain.produce(source, value=str(i).encode(), partition=i % PARTITIONS)
    assert plain.flush(30) == 0

    group = f"{topic_name}-group"
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([source])
    producers = []

    def transactional():
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": address, "transactional.id": f"{topic_name}-txn", "linger.ms": 5}
        )
        producers.append(producer)
        producer.init_transactions(30)
        producer.begin_transaction()
        return producer

    try:
        copied, batch_size = 0, COUNT // 10
        while copied < COUNT:
            batch = []
            deadline = time.monotonic() + 30
            while len(batch) < batch_size:
                assert time.monotonic() < deadline, f"consumed {copied + len(batch)} of {COUNT}"
                for message in consumer.consume(batch_size - len(batch), 0.5):
                    assert message.error() is None, message.error()
                    batch.append(message)
            producer = transactional()
            positions = {}
            for message in batch:
                producer.produce(sink, value=b"out-" + message.value(), partition=message.partition())
                positions[message.partition()] = message.offset() + 1
            producer.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(source, p, o) for p, o in sorted(positions.items())],
                consumer.consumer_group_metadata(),
                30,
            )
            producer.commit_transaction(30)
            copied += len(batch)
        aborted = transactional()
        for i in range(20):
            aborted.produce(sink, value=b"aborted-%d" % i, partition=i % PARTITIONS)
        assert aborted.flush(30) == 0
        aborted.abort_transaction(30)
    finally:
        consumer.close()
        for producer in producers:
            producer.purge()
            producer.flush(1)

    for gateway in gateways:
        assert requests_served(gateway, "EndTxn") > 0, f"no transaction ended on {gateway.bootstrap}"

    reader = confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": f"{topic_name}-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    reader.assign([confluent_kafka.TopicPartition(sink, p, 0) for p in range(PARTITIONS)])
    output = collections.Counter()
    deadline = time.monotonic() + 30
    try:
        while sum(output.values()) < COUNT:
            assert time.monotonic() < deadline, f"read {sum(output.values())} of {COUNT}"
            for message in reader.consume(100, 0.5):
                assert message.error() is None, message.error()
                output[message.value()] += 1
        # Nothing more: the aborted records stay unread.
        for message in reader.consume(100, 2):
            output[message.value()] += 1
    finally:
        reader.close()
    assert output == collections.Counter(b"out-%d" % i for i in range(COUNT))

    request = ConsumerGroupTopicPartitions(group, [confluent_kafka.TopicPartition(source, p) for p in range(PARTITIONS)])
    committed = admin.list_consumer_group_offsets([request])[group].result(15)
    assert {tp.partition: tp.offset for tp in committed.topic_partitions} == {
        p: COUNT // PARTITIONS for p in range(PARTITIONS)
    }

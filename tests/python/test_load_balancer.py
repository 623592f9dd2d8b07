"""kafka-python through a TCP load balancer (HAProxy) in front of two
gateways started without node ids, both advertising the load balancer: the
client sees one broker, and a two-member consumer group works whichever
gateway each of its connections lands on (group requests are forwarded to
the group's coordinator)."""

import socket
import subprocess
import tempfile
import threading
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import CommitFailedError, RebalanceInProgressError

from conftest import FAST_GROUP_SETTINGS, start_ketch, stop_ketch

PARTITIONS = 4
COUNT = 400


@pytest.fixture
def behind_lb(redis_url):
    """Two gateways behind HAProxy; yields the load balancer's address."""
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
        yield f"127.0.0.1:{port}"
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

"""Kafka transactions (KIP-98) with real clients.

Transactional producers (confluent-kafka / librdkafka, and kafka-python)
write through ketch; consumers read with isolation.level read_committed
(stops at the last stable offset, drops aborted records using the Fetch
response's aborted_transactions) or read_uncommitted (everything). Commit
and abort markers are control batches: consumers skip them, so a
transaction of N records in a partition takes N+1 offsets.

Gateways run with TXN_SETTINGS: FAST_GROUP_SETTINGS (conftest.py) and
transactions.abort_check_interval=200ms, so a timed-out transaction is
aborted within a fraction of a second of its timeout.

Every wait has a deadline; the only fixed-length waits are the "nothing is
delivered meanwhile" observation windows, named as such. Reads use
enable.partition.eof: librdkafka reports the end of a partition at the fetch
position that reached the high watermark (read_uncommitted) or the last
stable offset (read_committed), so "EOF at offset X" proves that every
record the consumer will ever see before X has been delivered.
"""

import collections
import time
import warnings

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from conftest import FAST_GROUP_SETTINGS
from helpers import eventually, find_coordinators

TXN_SETTINGS = (*FAST_GROUP_SETTINGS, "transactions.abort_check_interval=200ms")

# librdkafka normalises PRODUCER_FENCED and INVALID_PRODUCER_EPOCH to _FENCED
# (a fatal error); the raw codes are accepted too.
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
# librdkafka's OFFSET_INVALID: no committed offset.
NO_OFFSET = -1001
COMMITTED, UNCOMMITTED = "read_committed", "read_uncommitted"


# ---------------------------------------------------------------- helpers


@pytest.fixture
def clients():
    """Registers clients (confluent-kafka or kafka-python producers and
    consumers) and closes them at teardown, producers without waiting for
    undelivered records (a failed test's gateway may be gone)."""
    made = []

    def track(client):
        made.append(client)
        return client

    yield track
    for client in reversed(made):
        try:
            if isinstance(client, Producer):
                client.purge()
                client.flush(1)
                # A fenced producer's close() warns that it could not abort
                # its transaction: expected there.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", "Producer abort_transaction failed during close")
                    client.close()
            elif hasattr(client, "send"):  # kafka-python's KafkaProducer
                client.close(timeout=2)
            else:  # a Consumer, a Reader or a KafkaConsumer
                client.close()
        except Exception as e:  # keep closing the others; the test's own failure matters more
            print(f"closing {client}: {e}")


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(15)


def latest_offsets(bootstrap, topic, partitions, isolation):
    """{partition: ListOffsets latest}: the high watermark with
    IsolationLevel.READ_UNCOMMITTED, the last stable offset with
    READ_COMMITTED."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    futures = admin.list_offsets(request, isolation_level=isolation, request_timeout=10)
    return {tp.partition: future.result(15).offset for tp, future in futures.items()}


def high_watermarks(bootstrap, topic, partitions):
    return latest_offsets(bootstrap, topic, partitions, IsolationLevel.READ_UNCOMMITTED)


def stable_offsets(bootstrap, topic, partitions):
    return latest_offsets(bootstrap, topic, partitions, IsolationLevel.READ_COMMITTED)


def committed_offsets(bootstrap, group, topic, partitions):
    """{partition: offset} the group committed (NO_OFFSET: none), by
    OffsetFetch without require_stable: pending transactional offsets are not
    reported."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    result = admin.list_consumer_group_offsets([request], require_stable=False)[group].result(15)
    out = {}
    for tp in result.topic_partitions:
        assert tp.error is None, f"{group} {tp}: {tp.error}"
        out[tp.partition] = tp.offset
    return out


def transactional_producer(bootstrap, transactional_id, **config):
    return Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **config}
    )


def send(producer, topic, items):
    """Produces (partition, value) items (the value is the key too); returns
    the list delivery reports fill with (error, partition, offset, value)."""
    reports = []

    def on_delivery(err, msg):
        reports.append((err, msg.partition(), msg.offset(), msg.value()))

    for partition, value in items:
        while True:
            try:
                producer.produce(topic, value=value, key=value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    producer.poll(0)
    return reports


def delivered(producer, reports, count):
    """Flushes; asserts all `count` records were acknowledged without error;
    returns {partition: [offset, ...]} sorted."""
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered"
    assert len(reports) == count, f"{len(reports)} delivery reports, want {count}"
    errors = [r for r in reports if r[0] is not None]
    assert not errors, f"delivery errors: {errors[:5]}"
    out = collections.defaultdict(list)
    for _, partition, offset, _ in reports:
        out[partition].append(offset)
    return {p: sorted(o) for p, o in out.items()}


def assert_fenced(error, what):
    """`error` (a KafkaException's KafkaError) says the producer is fenced."""
    assert isinstance(error, KafkaError), f"{what}: {error!r}"
    assert error.code() in FENCED, f"{what}: {error} (code {error.code()}, fatal {error.fatal()}), want fenced"


class Reader:
    """A confluent-kafka consumer assigned every partition of a topic from
    offset 0 (no group, no commits), at one isolation level. `records`:
    {partition: [(offset, value), ...]} delivered so far; `eof`: {partition:
    offset of the latest end-of-partition event}."""

    def __init__(self, bootstrap, topic, partitions, isolation, **config):
        self.isolation = isolation
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                # Required by the client; never used: no subscribe(), no commits.
                "group.id": "unused",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                **config,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        self.records = {p: [] for p in partitions}
        self.eof = {p: None for p in partitions}

    def poll(self, timeout=0.2):
        msg = self.consumer.poll(timeout)
        if msg is None:
            return
        if msg.error():
            assert msg.error().code() == KafkaError._PARTITION_EOF, f"{self.isolation}: {msg.error()}"
            self.eof[msg.partition()] = msg.offset()
            return
        self.records[msg.partition()].append((msg.offset(), msg.value()))

    def read_to(self, ends, timeout=20.0):
        """Polls until every partition p reported its end at ends[p] or
        later; returns `records`."""
        deadline = time.monotonic() + timeout
        while not all(self.eof[p] is not None and self.eof[p] >= end for p, end in ends.items()):
            assert time.monotonic() < deadline, (
                f"{self.isolation}: ends {self.eof} after {timeout} s, want {ends}; "
                f"records so far {self.counts()}"
            )
            self.poll()
        return self.records

    def observe(self, seconds):
        """Observation window: polls for `seconds` whatever happens."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.records

    def counts(self):
        return {p: len(r) for p, r in self.records.items()}

    def values(self):
        return [v for p in sorted(self.records) for _, v in self.records[p]]

    def close(self):
        self.consumer.close()


def read(bootstrap, topic, ends, isolation, timeout=20.0):
    """{partition: [(offset, value), ...]} read from offset 0 until each
    partition p ends at ends[p] or later."""
    reader = Reader(bootstrap, topic, list(ends), isolation)
    try:
        return reader.read_to(ends, timeout)
    finally:
        reader.close()


def find_coordinator(address, key, key_type):
    """(error_code, node_id) as gateway `address` answers FindCoordinator
    for one key of `key_type` (0 group, 1 transaction)."""
    return find_coordinators(address, [key], key_type)[key]


def values(prefix, count):
    return [f"{prefix}-{i}".encode() for i in range(count)]


# ------------------------------------------------------------------ tests


def test_commit_and_abort_over_partitions_across_gateways(ketch_cluster, topic_name, clients):
    """The producer talks to gateway 1, consumers to gateway 2. A committed
    transaction over 3 partitions is seen by read_committed exactly; an
    aborted one is not (but read_uncommitted sees it); markers take one
    offset each."""
    partitions = range(3)
    one, two = ketch_cluster(2, settings=TXN_SETTINGS)
    create_topic(one.bootstrap, topic_name, 3)
    producer = clients(transactional_producer(one.bootstrap, f"{topic_name}-txn"))
    producer.init_transactions(15)

    committed = values("commit", 300)
    producer.begin_transaction()
    reports = send(producer, topic_name, [(i % 3, v) for i, v in enumerate(committed)])
    assert delivered(producer, reports, 300) == {p: list(range(0, 100)) for p in partitions}
    producer.commit_transaction(15)

    aborted = values("abort", 150)
    producer.begin_transaction()
    reports = send(producer, topic_name, [(i % 3, v) for i, v in enumerate(aborted)])
    # After the 100 records and the commit marker at 100.
    assert delivered(producer, reports, 150) == {p: list(range(101, 151)) for p in partitions}
    producer.abort_transaction(15)

    tail = values("tail", 30)
    producer.begin_transaction()
    reports = send(producer, topic_name, [(i % 3, v) for i, v in enumerate(tail)])
    # After the aborted records and the abort marker at 151.
    assert delivered(producer, reports, 30) == {p: list(range(152, 162)) for p in partitions}
    producer.commit_transaction(15)

    # 100 + marker + 50 + marker + 10 + marker.
    ends = {p: 163 for p in partitions}
    eventually(lambda: high_watermarks(two.bootstrap, topic_name, partitions), ends, "high watermarks")
    assert stable_offsets(two.bootstrap, topic_name, partitions) == ends

    got = read(two.bootstrap, topic_name, ends, COMMITTED)
    for p in partitions:
        want = [(o, committed[3 * i + p]) for i, o in enumerate(range(0, 100))]
        want += [(o, tail[3 * i + p]) for i, o in enumerate(range(152, 162))]
        assert got[p] == want, f"read_committed partition {p}: {got[p][:3]}...{got[p][-3:]}"

    got = read(two.bootstrap, topic_name, ends, UNCOMMITTED)
    for p in partitions:
        want = [(o, committed[3 * i + p]) for i, o in enumerate(range(0, 100))]
        want += [(o, aborted[3 * i + p]) for i, o in enumerate(range(101, 151))]
        want += [(o, tail[3 * i + p]) for i, o in enumerate(range(152, 162))]
        assert got[p] == want, f"read_uncommitted partition {p}: {got[p][:3]}...{got[p][-3:]}"


def test_open_transaction_holds_read_committed_at_the_last_stable_offset(ketch_cluster, topic_name, clients):
    """5 plain records, then a transaction of 20 records left open (flushed,
    not committed): the LSO stays at 5 while the high watermark is 25;
    read_committed gets the 5 and stops there, read_uncommitted gets all 25;
    after the commit read_committed gets the 20 too."""
    gateway = ketch_cluster(1, settings=TXN_SETTINGS)[0]
    bootstrap = gateway.bootstrap
    create_topic(bootstrap, topic_name, 1)
    plain = clients(Producer({"bootstrap.servers": bootstrap}))
    assert delivered(plain, send(plain, topic_name, [(0, v) for v in values("plain", 5)]), 5) == {0: list(range(5))}

    producer = clients(transactional_producer(bootstrap, f"{topic_name}-txn"))
    producer.init_transactions(15)
    producer.begin_transaction()
    in_txn = values("txn", 20)
    reports = send(producer, topic_name, [(0, v) for v in in_txn])
    assert delivered(producer, reports, 20) == {0: list(range(5, 25))}

    assert high_watermarks(bootstrap, topic_name, [0]) == {0: 25}
    assert stable_offsets(bootstrap, topic_name, [0]) == {0: 5}

    uncommitted = clients(Reader(bootstrap, topic_name, [0], UNCOMMITTED))
    assert [o for o, _ in uncommitted.read_to({0: 25})[0]] == list(range(25))

    reader = clients(Reader(bootstrap, topic_name, [0], COMMITTED))
    reader.read_to({0: 5})
    # Observation window: nothing past the LSO is delivered while the
    # transaction is open.
    reader.observe(2.0)
    assert reader.records[0] == list(zip(range(5), values("plain", 5)))
    assert reader.eof[0] == 5, f"read_committed ended at {reader.eof[0]}, want the LSO 5"
    assert stable_offsets(bootstrap, topic_name, [0]) == {0: 5}

    producer.commit_transaction(15)
    eventually(lambda: stable_offsets(bootstrap, topic_name, [0]), {0: 26}, "the LSO after the commit")
    assert high_watermarks(bootstrap, topic_name, [0]) == {0: 26}
    got = reader.read_to({0: 26}, timeout=10)[0]
    assert got == list(zip(range(5), values("plain", 5))) + list(zip(range(5, 25), in_txn))


def test_second_producer_with_the_same_id_aborts_and_fences_the_first(ketch_cluster, topic_name, clients):
    """A (gateway 1) produces in a transaction; B (gateway 2) with the same
    transactional.id calls init_transactions: A's transaction is aborted, A's
    commit fails fenced, A's records are never read_committed, B commits."""
    one, two = ketch_cluster(2, settings=TXN_SETTINGS)
    create_topic(one.bootstrap, topic_name, 1)
    txn_id = f"{topic_name}-txn"
    zombie = clients(transactional_producer(one.bootstrap, txn_id))
    zombie.init_transactions(15)
    zombie.begin_transaction()
    reports = send(zombie, topic_name, [(0, v) for v in values("zombie", 10)])
    assert delivered(zombie, reports, 10) == {0: list(range(10))}
    assert stable_offsets(two.bootstrap, topic_name, [0]) == {0: 0}

    successor = clients(transactional_producer(two.bootstrap, txn_id))
    successor.init_transactions(15)
    # The zombie's transaction is aborted: its marker at 10, nothing open.
    assert high_watermarks(two.bootstrap, topic_name, [0]) == {0: 11}
    assert stable_offsets(two.bootstrap, topic_name, [0]) == {0: 11}

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(15)
    assert_fenced(raised.value.args[0], "the zombie's commit_transaction")

    successor.begin_transaction()
    reports = send(successor, topic_name, [(0, v) for v in values("successor", 5)])
    assert delivered(successor, reports, 5) == {0: list(range(11, 16))}
    successor.commit_transaction(15)

    ends = {0: 17}
    assert read(one.bootstrap, topic_name, ends, COMMITTED)[0] == list(zip(range(11, 16), values("successor", 5)))
    assert read(one.bootstrap, topic_name, ends, UNCOMMITTED)[0] == list(
        zip(range(10), values("zombie", 10))
    ) + list(zip(range(11, 16), values("successor", 5)))


def test_fenced_producer_cannot_append(ketch_cluster, topic_name, clients):
    """After B's init_transactions, A's next records to the partition it
    already wrote to are refused (not stored) and A's commit fails fenced."""
    gateway = ketch_cluster(1, settings=TXN_SETTINGS)[0]
    bootstrap = gateway.bootstrap
    create_topic(bootstrap, topic_name, 1)
    txn_id = f"{topic_name}-txn"
    zombie = clients(transactional_producer(bootstrap, txn_id))
    zombie.init_transactions(15)
    zombie.begin_transaction()
    reports = send(zombie, topic_name, [(0, v) for v in values("before", 10)])
    assert delivered(zombie, reports, 10) == {0: list(range(10))}

    successor = clients(transactional_producer(bootstrap, txn_id))
    successor.init_transactions(15)
    assert high_watermarks(bootstrap, topic_name, [0]) == {0: 11}

    late = send(zombie, topic_name, [(0, v) for v in values("after", 5)])
    try:
        zombie.flush(15)
    except KafkaException as e:  # confluent-kafka raises a fatal error out of flush()
        assert_fenced(e.args[0], "flush of the fenced producer's records")
    accepted = [r for r in late if r[0] is None]
    assert not accepted, f"a fenced producer's records were acknowledged: {accepted}"
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(15)
    assert_fenced(raised.value.args[0], f"commit_transaction after failed deliveries {[r[0] for r in late]}")

    # Nothing of the fenced producer's was stored: its 10 records and the abort marker.
    assert high_watermarks(bootstrap, topic_name, [0]) == {0: 11}
    assert stable_offsets(bootstrap, topic_name, [0]) == {0: 11}
    assert read(bootstrap, topic_name, {0: 11}, UNCOMMITTED)[0] == list(zip(range(10), values("before", 10)))
    assert read(bootstrap, topic_name, {0: 11}, COMMITTED)[0] == []


def test_transaction_past_its_timeout_is_aborted_by_the_gateway(ketch_cluster, topic_name, clients):
    """A (transaction.timeout.ms=2000) produces and never commits; B commits
    records after A's. read_committed is held at A's first offset until the
    gateway aborts A (not before its timeout); then it gets B's records and
    never A's, and A is fenced."""
    gateway = ketch_cluster(1, settings=TXN_SETTINGS)[0]
    bootstrap = gateway.bootstrap
    create_topic(bootstrap, topic_name, 1)
    slow = clients(transactional_producer(bootstrap, f"{topic_name}-slow", **{"transaction.timeout.ms": 2000}))
    slow.init_transactions(15)
    slow.begin_transaction()
    started = time.monotonic()
    reports = send(slow, topic_name, [(0, v) for v in values("slow", 20)])
    assert delivered(slow, reports, 20) == {0: list(range(20))}
    lso = stable_offsets(bootstrap, topic_name, [0])
    if time.monotonic() - started < 1.5:  # certainly before the timeout
        assert lso == {0: 0}

    reader = clients(Reader(bootstrap, topic_name, [0], COMMITTED))
    fast = clients(transactional_producer(bootstrap, f"{topic_name}-fast"))
    fast.init_transactions(15)
    fast.begin_transaction()
    reports = send(fast, topic_name, [(0, v) for v in values("fast", 10)])
    delivered(fast, reports, 10)
    fast.commit_transaction(15)

    deadline = started + 15
    while len(reader.records[0]) < 10:
        assert time.monotonic() < deadline, (
            f"read_committed got {reader.records[0]}, ended at {reader.eof[0]}, 15 s after a transaction "
            f"with a 2 s timeout began; LSO {stable_offsets(bootstrap, topic_name, [0])}, "
            f"HW {high_watermarks(bootstrap, topic_name, [0])}"
        )
        reader.poll()
    elapsed = time.monotonic() - started
    assert elapsed >= 1.5, f"the open transaction stopped holding the LSO after {elapsed:.2f} s, before its 2 s timeout"
    assert [v for _, v in reader.records[0]] == values("fast", 10)

    # 20 + 10 records, 2 markers; nothing open.
    eventually(lambda: high_watermarks(bootstrap, topic_name, [0]), {0: 32}, "high watermark")
    assert stable_offsets(bootstrap, topic_name, [0]) == {0: 32}
    reader.read_to({0: 32}, timeout=10)
    assert [v for _, v in reader.records[0]] == values("fast", 10)
    uncommitted = read(bootstrap, topic_name, {0: 32}, UNCOMMITTED)[0]
    assert sorted(v for _, v in uncommitted) == sorted(values("slow", 20) + values("fast", 10))

    with pytest.raises(KafkaException) as raised:
        slow.commit_transaction(15)
    assert_fenced(raised.value.args[0], "commit_transaction of a timed-out transaction")
    assert stable_offsets(bootstrap, topic_name, [0]) == {0: 32}


def test_transaction_timeout_above_the_maximum_is_refused(ketch_cluster, topic_name, clients):
    """transactions.max_timeout=10s: transaction.timeout.ms=20000 fails
    init_transactions with INVALID_TRANSACTION_TIMEOUT (fatal); 10000 is
    accepted and commits."""
    gateway = ketch_cluster(1, settings=(*TXN_SETTINGS, "transactions.max_timeout=10s"))[0]
    bootstrap = gateway.bootstrap
    create_topic(bootstrap, topic_name, 1)

    too_long = clients(transactional_producer(bootstrap, f"{topic_name}-long", **{"transaction.timeout.ms": 20000}))
    with pytest.raises(KafkaException) as raised:
        too_long.init_transactions(15)
    error = raised.value.args[0]
    assert error.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT, f"{error} (code {error.code()})"
    assert error.fatal(), error

    at_limit = clients(transactional_producer(bootstrap, f"{topic_name}-ok", **{"transaction.timeout.ms": 10000}))
    at_limit.init_transactions(15)
    at_limit.begin_transaction()
    delivered(at_limit, send(at_limit, topic_name, [(0, b"ok")]), 1)
    at_limit.commit_transaction(15)
    assert read(bootstrap, topic_name, {0: 2}, COMMITTED)[0] == [(0, b"ok")]


def test_consume_transform_produce_commits_offsets_with_the_output(ketch_cluster, topic_name, clients):
    """2,000 input records are copied, batch by batch, each batch in one
    transaction with the group's offsets (send_offsets_to_transaction): the
    offsets are invisible until the commit and equal the consumed positions
    after it; the output holds every input record exactly once
    (read_committed). A last transaction, aborted, leaves the committed
    offsets as they were and its output unread."""
    partitions, total = range(3), 2_000
    gateway = ketch_cluster(1, settings=TXN_SETTINGS)[0]
    bootstrap = gateway.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, 3)
    create_topic(bootstrap, sink, 3)
    plain = clients(Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}))
    delivered(plain, send(plain, source, [(i % 3, str(i).encode()) for i in range(total)]), total)

    group = f"{topic_name}-g"
    consumer = clients(
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "isolation.level": COMMITTED,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
            }
        )
    )
    consumer.subscribe([source])
    producer = clients(transactional_producer(bootstrap, f"{topic_name}-txn"))
    producer.init_transactions(15)
    positions = {p: NO_OFFSET for p in partitions}

    def transform(count, finish):
        """Consumes `count` records and copies them in one transaction,
        with their offsets; `finish` commits or aborts it; returns the
        offsets it sent."""
        batch = []
        deadline = time.monotonic() + 20
        while len(batch) < count:
            assert time.monotonic() < deadline, f"consumed {len(batch)} of {count}"
            for msg in consumer.consume(count - len(batch), 0.5):
                assert msg.error() is None, msg.error()
                batch.append(msg)
        producer.begin_transaction()
        reports = send(producer, sink, [(m.partition(), b"out-" + m.value()) for m in batch])
        offsets = {}
        for m in batch:
            offsets[m.partition()] = max(offsets.get(m.partition(), 0), m.offset() + 1)
        producer.send_offsets_to_transaction(
            [TopicPartition(source, p, o) for p, o in sorted(offsets.items())],
            consumer.consumer_group_metadata(),
            15,
        )
        delivered(producer, reports, len(batch))
        # Pending: OffsetFetch still answers the offsets committed before.
        assert committed_offsets(bootstrap, group, source, partitions) == positions
        finish(15)
        return offsets

    done = 0
    while done < total:
        step = min(500, total - done)
        positions.update(transform(step, producer.commit_transaction))
        done += step
        eventually(lambda: committed_offsets(bootstrap, group, source, partitions), positions, f"after {done} records")
    ends = {p: len(range(p, total, 3)) for p in partitions}  # 667, 667, 666
    assert positions == ends

    # 90 more, copied in a transaction that is aborted.
    delivered(plain, send(plain, source, [(i % 3, str(i).encode()) for i in range(total, total + 90)]), 90)
    transform(90, producer.abort_transaction)
    assert committed_offsets(bootstrap, group, source, partitions) == ends

    # Once the abort markers are written, nothing is open.
    eventually(
        lambda: stable_offsets(bootstrap, sink, partitions) == high_watermarks(bootstrap, sink, partitions),
        True,
        "the sink's last stable offsets reach its high watermarks",
    )
    sink_ends = high_watermarks(bootstrap, sink, partitions)
    reader = clients(Reader(bootstrap, sink, partitions, COMMITTED))
    reader.read_to(sink_ends)
    output = collections.Counter(reader.values())
    assert sum(output.values()) == total and set(output) == {b"out-%d" % i for i in range(total)}, (
        f"{sum(output.values())} records, {len(output)} distinct; duplicates "
        f"{sorted(v for v, n in output.items() if n > 1)[:5]}; "
        f"aborted ones read {sorted(v for v in output if int(v[4:]) >= total)[:5]}"
    )
    for p in partitions:
        assert all(int(v[4:]) % 3 == p for _, v in reader.records[p]), f"partition {p}"
    everything = read(bootstrap, sink, sink_ends, UNCOMMITTED)
    assert sum(len(r) for r in everything.values()) == total + 90


def test_kafka_python_commit_and_abort(ketch_cluster, topic_name, clients):
    """kafka-python's transactional producer commits, aborts and commits
    again; a kafka-python consumer with isolation_level='read_committed' reads
    the committed records only, 'read_uncommitted' reads all of them. Group
    offsets sent in a committed transaction are applied, in an aborted one
    not."""
    import kafka
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaPythonTopicPartition
    from kafka.admin import NewTopic as KafkaPythonNewTopic
    from kafka.structs import OffsetAndMetadata

    if not hasattr(KafkaProducer, "init_transactions"):
        pytest.skip(f"kafka-python {kafka.__version__} has no transactional producer (needs >= 2.1)")
    gateway = ketch_cluster(1, settings=TXN_SETTINGS)[0]
    bootstrap = gateway.bootstrap
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([KafkaPythonNewTopic(topic_name, 2, 1)])
    finally:
        admin.close()

    producer = clients(KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic_name}-txn", linger_ms=5))
    producer.init_transactions()

    def transaction(vals, commit):
        producer.begin_transaction()
        futures = [producer.send(topic_name, value=v, key=v, partition=i % 2) for i, v in enumerate(vals)]
        producer.flush(30)
        metadata = [f.get(timeout=30) for f in futures]
        (producer.commit_transaction if commit else producer.abort_transaction)()
        return {p: sorted(m.offset for m in metadata if m.partition == p) for p in range(2)}

    committed, aborted, tail = values("commit", 20), values("abort", 10), values("tail", 4)
    assert transaction(committed, True) == {p: list(range(0, 10)) for p in range(2)}
    assert transaction(aborted, False) == {p: list(range(11, 16)) for p in range(2)}
    assert transaction(tail, True) == {p: list(range(17, 19)) for p in range(2)}

    def consume(isolation, want):
        consumer = clients(
            KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level=isolation)
        )
        tps = [KafkaPythonTopicPartition(topic_name, p) for p in range(2)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = {p: [] for p in range(2)}
        deadline = time.monotonic() + 20
        while any(len(got[p]) < len(want[p]) for p in range(2)):
            assert time.monotonic() < deadline, f"{isolation}: {got}"
            for tp, batch in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend((m.offset, m.value) for m in batch)
        assert consumer.end_offsets(tps) == {tp: 20 for tp in tps}
        assert got == want, isolation

    consume(
        "read_committed",
        {p: list(zip(range(0, 10), committed[p::2])) + list(zip(range(17, 19), tail[p::2])) for p in range(2)},
    )

    # Offsets in transactions (AddOffsetsToTxn, TxnOffsetCommit as
    # kafka-python sends them, for a group given by its bare id): applied on
    # commit, not on abort.
    group = f"{topic_name}-g"
    for offset, commit in ((7, True), (9, False)):
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            {KafkaPythonTopicPartition(topic_name, 0): OffsetAndMetadata(offset, "", -1)}, group
        )
        (producer.commit_transaction if commit else producer.abort_transaction)()
        eventually(lambda: committed_offsets(bootstrap, group, topic_name, [0]), {0: 7}, f"after offset {offset}")
    consume(
        "read_uncommitted",
        {
            p: list(zip(range(0, 10), committed[p::2]))
            + list(zip(range(11, 16), aborted[p::2]))
            + list(zip(range(17, 19), tail[p::2]))
            for p in range(2)
        },
    )


def test_transaction_survives_its_coordinator_gateway_crash(ketch_cluster, topic_name, clients):
    """Both gateways name the same transaction coordinator (rendezvous
    hashing); after that gateway is killed mid-transaction the producer finds
    the other one, which commits the transaction from the state in Redis."""
    partitions = range(2)
    gateways = ketch_cluster(2, settings=TXN_SETTINGS)
    create_topic(gateways[0].bootstrap, topic_name, 2)
    txn_id = f"{topic_name}-txn"
    answers = {g.node_id: find_coordinator(g.bootstrap, txn_id, 1) for g in gateways}
    assert len(set(answers.values())) == 1 and next(iter(answers.values()))[0] == 0, answers
    coordinator = next(iter(answers.values()))[1]
    victim = next(g for g in gateways if g.node_id == coordinator)
    survivor = next(g for g in gateways if g.node_id != coordinator)

    producer = clients(transactional_producer(survivor.bootstrap, txn_id))
    producer.init_transactions(15)
    producer.begin_transaction()
    vals = values("survivor", 20)
    reports = send(producer, topic_name, [(i % 2, v) for i, v in enumerate(vals)])
    assert delivered(producer, reports, 20) == {p: list(range(10)) for p in partitions}

    victim.kill()
    deadline = time.monotonic() + 20
    while True:
        try:
            producer.commit_transaction(max(1.0, deadline - time.monotonic()))
            break
        except KafkaException as e:
            # librdkafka's contract: a retriable error means "call again".
            if not e.args[0].retriable() or time.monotonic() > deadline:
                raise
    assert find_coordinator(survivor.bootstrap, txn_id, 1) == (0, survivor.node_id)

    ends = {p: 11 for p in partitions}
    eventually(lambda: stable_offsets(survivor.bootstrap, topic_name, partitions), ends, "the LSO after the commit")
    got = read(survivor.bootstrap, topic_name, ends, COMMITTED)
    assert got == {p: list(zip(range(10), vals[p::2])) for p in partitions}

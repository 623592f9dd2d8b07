"""Consumer groups and gateway membership (issue #4) with real clients.

confluent-kafka consumers subscribe() and are assigned partitions by the
group coordinator; confluent-kafka and kafka-python admin clients list,
describe and delete groups and read committed offsets. Gateways run with
FAST_GROUP_SETTINGS (conftest.py): dead gateways are noticed within ~2 s, a
new group's first rebalance waits 0.5 s, sessions may be as short as 1 s.

Consumers in one test are polled round-robin from the test's thread (so
their rebalance callbacks run there), every wait has a deadline, and nothing
sleeps for a fixed time except the "nothing else happens" observation
windows, which are named as such.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonTopicPartition

from helpers import find_coordinators

# session.timeout.ms of every member: Kafka's usual lower bound (and ketch's
# default groups.min_session_timeout), short enough for the tests.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500
# groups.initial_rebalance_delay and cluster.node_timeout in
# FAST_GROUP_SETTINGS.
INITIAL_REBALANCE_DELAY_S = 0.5
NODE_TIMEOUT_S = 2.0
# librdkafka's OFFSET_INVALID: no committed offset.
NO_OFFSET = -1001


# ---------------------------------------------------------------- helpers


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(15)


class Feeder:
    """A producer writing records whose value is a running counter
    ("0", "1", ...), record i to partition i % partitions."""

    def __init__(self, bootstrap, topic, partitions):
        self.topic = topic
        self.partitions = partitions
        self.next = 0
        self.errors = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def _report(self, err, msg):
        if err is not None:
            self.errors.append(err)

    def produce(self, count):
        for _ in range(count):
            i = self.next
            while True:
                try:
                    self.producer.produce(
                        self.topic, value=str(i).encode(), partition=i % self.partitions, on_delivery=self._report
                    )
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.next += 1
        self.producer.poll(0)

    def produce_up_to(self, total, step):
        self.produce(max(0, min(step, total - self.next)))

    def flush(self):
        remaining = self.producer.flush(30)
        assert remaining == 0, f"{remaining} records not delivered"
        assert not self.errors, f"delivery errors: {self.errors[:5]}"

    def close(self):
        # Drop what is undelivered (a failed test's gateway may be gone), so
        # close() does not wait, and no producer outlives its test.
        self.producer.purge()
        self.producer.flush(1)
        self.producer.close()


@pytest.fixture
def feeders():
    """Makes Feeders and closes them at teardown."""
    made = []

    def make(bootstrap, topic, partitions):
        made.append(Feeder(bootstrap, topic, partitions))
        return made[-1]

    yield make
    for feeder in made:
        feeder.close()


class Tally:
    """Every record any member processed: value -> times processed."""

    def __init__(self):
        self.counts = collections.Counter()

    def unique(self):
        return len(self.counts)

    def duplicates(self):
        return sorted((int(v), n) for v, n in self.counts.items() if n > 1)


class Member:
    """A confluent-kafka consumer in a group (subscribe()), committing
    synchronously after every batch it processed and in on_revoke, so a
    rebalance never hands a processed but uncommitted record to another
    member. Keeps its current assignment and counts its callbacks.

    strict: any consumer error or failed commit raises (out of poll()).
    Otherwise they are recorded in `errors` (a test that kills a gateway
    expects some). commits=False: the member never commits by itself (the
    test commits explicitly)."""

    def __init__(self, name, bootstrap, group, topic, tally=None, strict=True, commits=True, **config):
        self.name = name
        self.topic = topic
        self.tally = tally if tally is not None else Tally()
        self.strict = strict
        self.auto_commits = commits
        self.assignment = set()
        self.assigns = 0
        self.revokes = 0
        self.losts = 0
        self.commits = 0
        self.errors = []
        self.records = []  # (partition, offset, value, monotonic time)
        self.closed = False
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "error_cb": self._on_error,
                **config,
            }
        )
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    def __repr__(self):
        return f"{self.name}{sorted(self.assignment)}"

    def _on_error(self, err):
        self.errors.append(err)

    def _on_assign(self, consumer, partitions):
        self.assigns += 1
        self.assignment = {tp.partition for tp in partitions}

    def _on_revoke(self, consumer, partitions):
        self.revokes += 1
        if self.auto_commits:
            self.commit()
        self.assignment -= {tp.partition for tp in partitions}

    def _on_lost(self, consumer, partitions):
        # Lost partitions may already be someone else's: no commit.
        self.losts += 1
        self.assignment -= {tp.partition for tp in partitions}

    def commit(self):
        """Commits the offsets after every record processed so far."""
        try:
            result = self.consumer.commit(asynchronous=False)
        except KafkaException as e:
            err = e.args[0]
            if err.code() == KafkaError._NO_OFFSET:
                return
            self._failed(f"{self.name}: commit failed: {err}")
            return
        failed = [tp for tp in result or () if tp.error is not None]
        if failed:
            self._failed(f"{self.name}: commit failed for {failed}")
        else:
            self.commits += 1

    def _failed(self, what):
        self.errors.append(what)
        if self.strict:
            raise AssertionError(what)

    def poll(self, timeout=0.05, max_records=500):
        """Processes (records) up to `max_records` records, waiting up to
        `timeout` for the first, then commits. One poll() per record rather
        than consume() batches, so a rebalance callback run inside a poll
        commits exactly the records processed before it."""
        processed = 0
        for i in range(max_records):
            msg = self.consumer.poll(timeout if i == 0 else 0)
            if msg is None:
                break
            if msg.error() is not None:
                self._failed(f"{self.name}: consumer error {msg.error()}")
                continue
            self.records.append((msg.partition(), msg.offset(), msg.value(), time.monotonic()))
            self.tally.counts[msg.value()] += 1
            processed += 1
        if processed and self.auto_commits:
            self.commit()
        return processed

    def close(self):
        if not self.closed:
            self.closed = True
            self.consumer.close()


def poll_until(condition, members, timeout, what, step=None):
    """Polls every open member round-robin (and runs `step`, e.g. produce
    more) until `condition()` holds; fails after `timeout` seconds naming
    `what` and the members' assignments. Returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not after {timeout} s; members {[m for m in members if not m.closed]}, "
                f"errors {[e for m in members for e in m.errors][:10]}"
            )
        if step is not None:
            step()
        for m in members:
            if not m.closed:
                m.poll()
    return time.monotonic() - start


def poll_for(seconds, members):
    """An observation window: polls every open member for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for m in members:
            if not m.closed:
                m.poll()


def balanced(members, partitions, sizes):
    """The open members' assignments have `sizes` (in any order), are
    disjoint and cover every partition."""
    open_members = [m for m in members if not m.closed]
    got = [len(m.assignment) for m in open_members]
    union = set().union(*(m.assignment for m in open_members))
    return sorted(got) == sorted(sizes) and sum(got) == len(union) == partitions


def close_all(members):
    for m in members:
        try:
            m.close()
        except Exception as e:  # keep closing the others; the test's own failure matters more
            print(f"closing {m.name}: {e}")


def committed_offsets(bootstrap, group, topic=None, partitions=None):
    """{partition: (offset, metadata)} of a group's committed offsets, through
    confluent-kafka's AdminClient (OffsetFetch)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = None if partitions is None else [TopicPartition(topic, p) for p in partitions]
    request = ConsumerGroupTopicPartitions(group, wanted)
    result = admin.list_consumer_group_offsets([request])[group].result(15)
    out = {}
    for tp in result.topic_partitions:
        assert tp.error is None, f"{group} {tp}: {tp.error}"
        if topic is None or tp.topic == topic:
            out[tp.partition] = (tp.offset, tp.metadata)
    return out


def describe_group(bootstrap, group):
    # Keep the AdminClient referenced until the answer is in: a client
    # destroyed earlier never completes its futures.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(15)


def coordinator_of(address, group):
    error_code, node_id = find_coordinators(address, [group])[group]
    assert error_code == 0, f"FindCoordinator {group} at {address}: error {error_code}"
    return node_id


# ------------------------------------------------------------------ tests


def test_members_share_partitions_and_consume_every_record_once(group_ketch, topic_name, feeders):
    """3 members on 12 partitions get 4 each; a 4th joins -> 3/3/3/3; one
    leaves -> 4/4/4; 30,000 records, produced while the group changes, are
    each processed exactly once, and the group's committed offsets end at the
    log end."""
    partitions, total = 12, 30_000
    bootstrap = group_ketch.bootstrap
    create_topic(bootstrap, topic_name, partitions)
    group = f"{topic_name}-g"
    feeder = feeders(bootstrap, topic_name, partitions)
    feeder.produce(10_000)
    feeder.flush()
    tally = Tally()
    members = []
    try:
        members += [Member(f"c{i}", bootstrap, group, topic_name, tally) for i in (1, 2, 3)]
        poll_until(lambda: balanced(members, partitions, [4, 4, 4]), members, 30, "three members get 4 partitions each")

        # A fourth member joins while records keep arriving.
        members.append(Member("c4", bootstrap, group, topic_name, tally))
        poll_until(
            lambda: balanced(members, partitions, [3, 3, 3, 3]) and feeder.next == 20_000,
            members,
            30,
            "four members get 3 partitions each",
            step=lambda: feeder.produce_up_to(20_000, 250),
        )

        # One leaves (LeaveGroup on close, after committing in on_revoke).
        members[1].close()
        poll_until(
            lambda: balanced(members, partitions, [4, 4, 4]) and feeder.next == total,
            members,
            30,
            "after one left, three members get 4 partitions each",
            step=lambda: feeder.produce_up_to(total, 250),
        )
        feeder.flush()
        poll_until(lambda: tally.unique() == total, members, 30, f"all {total} records consumed")
        # Observation window: nothing is delivered a second time.
        poll_for(1.5, members)

        assert tally.duplicates() == [], "records processed twice (value, times)"
        assert sorted(int(v) for v in tally.counts) == list(range(total))
        per_member = {m.name: len(m.records) for m in members}
        print(f"records per member {per_member}; assigns {[(m.name, m.assigns, m.revokes) for m in members]}")
        assert all(per_member.values()), f"a member processed nothing: {per_member}"
        for m in members:
            assert m.losts == 0, f"{m.name} lost its assignment"
        offsets = committed_offsets(bootstrap, group, topic_name)
        assert {p: o for p, (o, _) in offsets.items()} == {p: total // partitions for p in range(partitions)}
    finally:
        close_all(members)


def test_restarted_consumer_resumes_at_committed_offsets(group_ketch, topic_name, feeders):
    """Commit (with metadata) at chosen offsets, close, start a new consumer
    in the same group: it reads from exactly those offsets (not from the
    start, and not from the end: it uses auto.offset.reset=latest)."""
    bootstrap = group_ketch.bootstrap
    create_topic(bootstrap, topic_name, 3)
    group = f"{topic_name}-g"
    feeder = feeders(bootstrap, topic_name, 3)
    feeder.produce(150)  # 50 per partition
    feeder.flush()

    first = Member("first", bootstrap, group, topic_name, commits=False)
    try:
        poll_until(lambda: len(first.records) == 150, [first], 30, "first consumer reads everything")
        marks = {0: 20, 1: 35, 2: 50}
        first.consumer.commit(
            offsets=[TopicPartition(topic_name, p, o, f"mark-{o}") for p, o in marks.items()], asynchronous=False
        )
    finally:
        first.close()
    assert committed_offsets(bootstrap, group, topic_name) == {p: (o, f"mark-{o}") for p, o in marks.items()}

    # commits=False: its committed offsets stay the first one's marks.
    second = Member("second", bootstrap, group, topic_name, commits=False, **{"auto.offset.reset": "latest"})
    try:
        poll_until(lambda: len(second.records) == 30 + 15, [second], 30, "second consumer resumes")
        committed = second.consumer.committed([TopicPartition(topic_name, p) for p in range(3)], timeout=10)
        assert {tp.partition: (tp.offset, tp.metadata) for tp in committed} == {
            p: (o, f"mark-{o}") for p, o in marks.items()
        }
        feeder.produce(3)  # one more per partition: 50 on each
        feeder.flush()
        poll_until(lambda: len(second.records) == 48, [second], 30, "second consumer reads new records")
        read = collections.defaultdict(list)
        for p, o, _, _ in second.records:
            read[p].append(o)
        assert dict(read) == {0: list(range(20, 51)), 1: list(range(35, 51)), 2: [50]}
    finally:
        second.close()


def test_coordinators_spread_over_gateways_and_move_only_from_a_dead_one(ketch_cluster):
    """Every gateway names the same coordinator for each group (FindCoordinator
    v4, 30 keys in one request), all three gateways coordinate some groups,
    and after kill -9 of one, only its groups move, to live gateways."""
    gateways = ketch_cluster(3)
    groups = [f"spread-{i}" for i in range(30)]
    answers = {g.node_id: find_coordinators(g.bootstrap, groups) for g in gateways}
    for node_id, answer in answers.items():
        assert all(code == 0 for code, _ in answer.values()), answer
        assert answer == answers[1], f"gateway {node_id} disagrees with gateway 1"
    before = {group: node for group, (_, node) in answers[1].items()}
    assert set(before.values()) == {1, 2, 3}, collections.Counter(before.values())

    victim, survivors = gateways[1], [gateways[0], gateways[2]]
    victim.kill()
    killed_at = time.monotonic()
    deadline = killed_at + 15
    while True:
        answers = {g.node_id: find_coordinators(g.bootstrap, groups) for g in survivors}
        if all(node != victim.node_id for a in answers.values() for _, node in a.values()):
            break
        assert time.monotonic() < deadline, f"groups still on the dead gateway: {answers}"
        time.sleep(0.1)
    moved_after = time.monotonic() - killed_at
    assert moved_after < NODE_TIMEOUT_S + 3, f"coordinators moved only after {moved_after:.1f} s"
    for node_id, answer in answers.items():
        assert answer == answers[survivors[0].node_id], f"gateway {node_id} disagrees"
    after = {group: node for group, (_, node) in answers[survivors[0].node_id].items()}
    for group in groups:
        if before[group] != victim.node_id:
            assert after[group] == before[group], f"{group} moved from live gateway {before[group]}"
        else:
            assert after[group] in {g.node_id for g in survivors}, group


def test_members_follow_a_killed_coordinator_without_losing_commits(ketch_cluster, topic_name, feeders):
    """Two members of a busy group (records produced throughout) bootstrap
    with all three gateways; kill -9 the group's coordinator: the members
    find the new one and keep consuming every partition, the committed
    offsets from before the kill are still there, and no record below them
    is consumed again."""
    partitions = 6
    gateways = ketch_cluster(3)
    bootstrap = ",".join(g.bootstrap for g in gateways)
    create_topic(bootstrap, topic_name, partitions)
    group = f"{topic_name}-busy"
    coordinator = coordinator_of(gateways[0].bootstrap, group)
    victim = next(g for g in gateways if g.node_id == coordinator)
    survivor = next(g for g in gateways if g is not victim)

    feeder = feeders(bootstrap, topic_name, partitions)
    members = []
    try:
        members += [Member(f"c{i}", bootstrap, group, topic_name, strict=False) for i in (1, 2)]
        consumed = lambda: sum(len(m.records) for m in members)  # noqa: E731
        poll_until(
            lambda: balanced(members, partitions, [3, 3]) and consumed() >= 1_000,
            members,
            30,
            "two members share the topic and consume",
            step=lambda: feeder.produce(60),
        )
        description = describe_group(bootstrap, group)
        assert description.coordinator.id == coordinator
        before = committed_offsets(bootstrap, group, topic_name)
        assert set(before) == set(range(partitions)) and all(o > 0 for o, _ in before.values()), before

        victim.kill()
        killed_at = time.monotonic()

        def progressed():
            after_kill = [(p, o) for m in members for p, o, _, t in m.records if t > killed_at]
            partitions_read = {p for p, o in after_kill if o >= before[p][0]}
            return len(after_kill) >= 1_000 and partitions_read == set(range(partitions))

        took = poll_until(
            progressed, members, 35, "members consume again after the kill", step=lambda: feeder.produce(60)
        )
        print(f"consuming every partition again {took:.1f} s after the kill")

        new_coordinator = coordinator_of(survivor.bootstrap, group)
        assert new_coordinator != victim.node_id
        rewound = sorted(
            (p, o) for m in members for p, o, _, t in m.records if t > killed_at and o < before[p][0]
        )
        assert rewound == [], f"records below the committed offsets {before} consumed again"
        # The commits go to the new coordinator now, and none went backwards.
        after = committed_offsets(survivor.bootstrap, group, topic_name)
        for p in range(partitions):
            assert after[p][0] >= before[p][0], f"partition {p}: committed {after[p][0]} < {before[p][0]} before"
        assert any(m.commits for m in members)
        feeder.flush()
    finally:
        close_all(members)


STOPPABLE_MEMBER = r"""
import sys
from confluent_kafka import Consumer

bootstrap, group, topic, session_ms, heartbeat_ms = sys.argv[1:6]
consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "client.id": "stoppable",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "session.timeout.ms": int(session_ms),
    "heartbeat.interval.ms": int(heartbeat_ms),
})

def on_assign(consumer, partitions):
    print("assigned", *sorted(tp.partition for tp in partitions), flush=True)

consumer.subscribe([topic], on_assign=on_assign)
while True:
    consumer.poll(0.2)
"""


class StoppableMember:
    """A consumer in a child process (python -c), so the test can SIGSTOP it:
    it stops heartbeating without closing its connections."""

    def __init__(self, bootstrap, group, topic):
        self.assignment = None
        self.lines = collections.deque(maxlen=100)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STOPPABLE_MEMBER, bootstrap, group, topic]
            + [str(SESSION_TIMEOUT_MS), str(HEARTBEAT_INTERVAL_MS)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if line.startswith("assigned"):
                self.assignment = {int(p) for p in line.split()[1:]}

    def __repr__(self):
        return f"stoppable{sorted(self.assignment or ())}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)  # also ends a stopped process
        self.proc.wait(10)
        self._thread.join(5)
        print("--- stoppable member output ---\n" + "\n".join(self.lines))


def test_member_that_stops_heartbeating_is_removed_and_its_partitions_reassigned(group_ketch, topic_name, feeders):
    """A member frozen with SIGSTOP stops heartbeating; within session timeout
    (+ the 0.5 s rebalance delay and a heartbeat round or two) the other
    member has all partitions and reads from them."""
    partitions = 6
    bootstrap = group_ketch.bootstrap
    create_topic(bootstrap, topic_name, partitions)
    group = f"{topic_name}-g"
    stoppable = StoppableMember(bootstrap, group, topic_name)
    member = None
    try:
        member = Member("live", bootstrap, group, topic_name)
        poll_until(
            lambda: stoppable.assignment is not None
            and len(stoppable.assignment) == 3
            and len(member.assignment) == 3
            and not stoppable.assignment & member.assignment,
            [member],
            30,
            f"the two members share the partitions ({stoppable})",
        )
        os.kill(stoppable.proc.pid, signal.SIGSTOP)
        took = poll_until(
            lambda: member.assignment == set(range(partitions)), [member], 30, "the live member gets every partition"
        )
        print(f"partitions reassigned {took:.1f} s after SIGSTOP")
        bound = SESSION_TIMEOUT_MS / 1000 + INITIAL_REBALANCE_DELAY_S + 2 * HEARTBEAT_INTERVAL_MS / 1000 + 1.5
        assert took <= bound, f"reassigned {took:.1f} s after the member stopped; want <= {bound} s"
        # Its last heartbeat was at most one interval before the stop.
        assert took >= SESSION_TIMEOUT_MS / 1000 - HEARTBEAT_INTERVAL_MS / 1000 - 0.5, (
            f"removed {took:.1f} s after it stopped, before its session timed out"
        )

        feeder = feeders(bootstrap, topic_name, partitions)
        feeder.produce(60)
        feeder.flush()
        poll_until(lambda: len(member.records) == 60, [member], 30, "the live member reads every partition")
        assert {p for p, _, _, _ in member.records} == set(range(partitions))
    finally:
        stoppable.kill()
        if member is not None:
            member.close()


def _group_with_offsets(bootstrap, group, topic, offsets, keep=False):
    """A group whose member subscribed to `topic`, was assigned all its
    partitions and committed `offsets` ({partition: offset}, metadata
    "m<offset>"). Returns the member if `keep`, else closes it (the group is
    then Empty, with its offsets)."""
    member = Member(group, bootstrap, group, topic, commits=False)
    try:
        poll_until(lambda: member.assignment == set(offsets), [member], 30, f"{group} is assigned {sorted(offsets)}")
        member.consumer.commit(
            offsets=[TopicPartition(topic, p, o, f"m{o}") for p, o in offsets.items()], asynchronous=False
        )
    except BaseException:
        member.close()
        raise
    if keep:
        return member
    member.close()
    return None


def _error_code(future):
    with pytest.raises(KafkaException) as raised:
        future.result(15)
    return raised.value.args[0].code()


def test_admin_clients_list_describe_and_delete_groups_and_read_offsets(group_ketch, topic_name, feeders):
    """Groups: one Stable (a live member), two Empty with committed offsets.
    confluent-kafka's AdminClient and kafka-python's KafkaAdminClient list
    them (with a state filter), describe them, read and alter their offsets,
    delete offsets (OffsetDelete) and delete the empty groups; deleting the
    live one is NON_EMPTY_GROUP."""
    bootstrap = group_ketch.bootstrap
    create_topic(bootstrap, topic_name, 3)
    feeder = feeders(bootstrap, topic_name, 3)
    feeder.produce(30)  # offsets 0-9 on each partition
    feeder.flush()
    active, idle_c, idle_k = (f"{topic_name}-{s}" for s in ("active", "idle-c", "idle-k"))
    member = _group_with_offsets(bootstrap, active, topic_name, {0: 1, 1: 2, 2: 3}, keep=True)
    try:
        _group_with_offsets(bootstrap, idle_c, topic_name, {0: 4, 1: 5, 2: 6})
        _group_with_offsets(bootstrap, idle_k, topic_name, {0: 7, 1: 8, 2: 9})
        poll_for(0.5, [member])  # keep the active member's session alive

        # --- confluent-kafka AdminClient
        admin = AdminClient({"bootstrap.servers": bootstrap})
        listing = admin.list_consumer_groups(request_timeout=15).result(15)
        assert not listing.errors, listing.errors
        states = {g.group_id: g.state for g in listing.valid}
        assert states == {
            active: ConsumerGroupState.STABLE,
            idle_c: ConsumerGroupState.EMPTY,
            idle_k: ConsumerGroupState.EMPTY,
        }
        assert not any(g.is_simple_consumer_group for g in listing.valid)
        empty = admin.list_consumer_groups(request_timeout=15, states={ConsumerGroupState.EMPTY}).result(15)
        assert {g.group_id for g in empty.valid} == {idle_c, idle_k}

        described = {g: f.result(15) for g, f in admin.describe_consumer_groups([active, idle_c]).items()}
        d = described[active]
        assert d.state == ConsumerGroupState.STABLE
        assert d.partition_assignor == "range"
        assert d.coordinator.id == group_ketch.node_id
        assert len(d.members) == 1
        assert d.members[0].client_id == active
        assert sorted((tp.topic, tp.partition) for tp in d.members[0].assignment.topic_partitions) == [
            (topic_name, p) for p in range(3)
        ]
        assert described[idle_c].state == ConsumerGroupState.EMPTY
        assert described[idle_c].members == []

        assert committed_offsets(bootstrap, idle_c, topic_name) == {0: (4, "m4"), 1: (5, "m5"), 2: (6, "m6")}
        assert committed_offsets(bootstrap, active, topic_name, [1]) == {1: (2, "m2")}
        # An admin commit (no member, generation -1) into an empty group.
        altered = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(idle_c, [TopicPartition(topic_name, 0, 40)])]
        )[idle_c].result(15)
        assert [(tp.partition, tp.error) for tp in altered.topic_partitions] == [(0, None)]
        assert committed_offsets(bootstrap, idle_c, topic_name)[0][0] == 40

        assert _error_code(admin.delete_consumer_groups([active])[active]) == KafkaError.NON_EMPTY_GROUP
        assert admin.delete_consumer_groups([idle_c])[idle_c].result(15) is None
        remaining = admin.list_consumer_groups(request_timeout=15).result(15)
        assert {g.group_id for g in remaining.valid} == {active, idle_k}
        gone = committed_offsets(bootstrap, idle_c, topic_name, [0, 1, 2])
        assert all(o in (-1, NO_OFFSET) for o, _ in gone.values()), gone

        # --- kafka-python KafkaAdminClient
        kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            groups = {g["group_id"]: g for g in kadmin.list_groups()}
            assert set(groups) == {active, idle_k}
            assert {g["protocol_type"] for g in groups.values()} == {"consumer"}
            stable = kadmin.list_groups(states_filter=["Stable"])
            assert [g["group_id"] for g in stable] == [active]

            described = kadmin.describe_groups([active, idle_k])
            assert described[active]["error"] is None
            assert described[active]["group_state"] == "Stable"
            assert described[active]["protocol_type"] == "consumer"
            assert described[active]["protocol_data"] == "range"
            assert len(described[active]["members"]) == 1
            assert described[idle_k]["group_state"] == "Empty"
            assert described[idle_k]["members"] == []

            offsets = kadmin.list_group_offsets({idle_k: None})[idle_k]
            # confluent-kafka (which committed them) sends the metadata
            # string's terminating NUL as part of it; ketch keeps the bytes.
            read = {tp.partition: (om.offset, om.metadata.rstrip("\x00")) for tp, om in offsets.items()}
            assert read == {
                0: (7, "m7"),
                1: (8, "m8"),
                2: (9, "m9"),
            }
            # Several groups in one OffsetFetch (v8+).
            both = kadmin.list_group_offsets([active, idle_k])
            assert {tp.partition: om.offset for tp, om in both[active].items()} == {0: 1, 1: 2, 2: 3}

            # OffsetDelete: refused while a member is subscribed to the topic.
            tp0 = KafkaPythonTopicPartition(topic_name, 0)
            refused = kadmin.delete_group_offsets(active, [tp0])
            assert refused[tp0].__name__ == "GroupSubscribedToTopicError", refused
            deleted = kadmin.delete_group_offsets(idle_k, [tp0])
            assert deleted[tp0].__name__ == "NoError", deleted
            offsets = kadmin.list_group_offsets({idle_k: None})[idle_k]
            assert {tp.partition: om.offset for tp, om in offsets.items() if om.offset >= 0} == {1: 8, 2: 9}

            assert kadmin.delete_groups([active]) == {active: "NonEmptyGroupError"}
            assert kadmin.delete_groups([idle_k]) == {idle_k: "OK"}
            assert {g["group_id"] for g in kadmin.list_groups()} == {active}
        finally:
            kadmin.close()
    finally:
        member.close()


def test_static_member_restarted_within_session_timeout_keeps_partitions_without_rebalance(group_ketch, topic_name):
    """Three static members (group.instance.id); the last one closes (a
    static member sends no LeaveGroup) and a new consumer with its instance
    id joins within the session timeout: it gets the same partitions, and
    the other members see no rebalance (no assign/revoke callbacks)."""
    partitions = 6
    bootstrap = group_ketch.bootstrap
    create_topic(bootstrap, topic_name, partitions)
    group = f"{topic_name}-g"
    members = []
    try:
        # The first member joins alone, so it is (and by Kafka's rules stays)
        # the group leader; the restarted one is a follower.
        members.append(Member("s1", bootstrap, group, topic_name, **{"group.instance.id": "s1"}))
        poll_until(lambda: len(members[0].assignment) == partitions, members, 30, "s1 gets every partition")
        members += [
            Member(name, bootstrap, group, topic_name, **{"group.instance.id": name}) for name in ("s2", "s3")
        ]
        poll_until(lambda: balanced(members, partitions, [2, 2, 2]), members, 30, "three static members get 2 each")
        # Observation window: let any rebalance still under way show itself.
        poll_for(2 * HEARTBEAT_INTERVAL_MS / 1000 + 1, members)
        assert balanced(members, partitions, [2, 2, 2]), members
        s1, s2, s3 = members
        callbacks = {m.name: (m.assigns, m.revokes, frozenset(m.assignment)) for m in (s1, s2)}
        s3_partitions = set(s3.assignment)
        s3_member_id = s3.consumer.memberid()

        s3.close()
        closed_at = time.monotonic()
        restarted = Member("s3-restarted", bootstrap, group, topic_name, **{"group.instance.id": "s3"})
        members.append(restarted)
        took = poll_until(lambda: restarted.assignment, members, 30, "the restarted static member is assigned")
        assert took < SESSION_TIMEOUT_MS / 1000, f"restart took {took:.1f} s, longer than the session timeout"
        assert restarted.assignment == s3_partitions
        # Observation window, until after the closed consumer's session would
        # have expired (had the new one not replaced it) and a few heartbeat
        # rounds more: no rebalance.
        window_end = closed_at + SESSION_TIMEOUT_MS / 1000 + 3 * HEARTBEAT_INTERVAL_MS / 1000
        poll_for(window_end - time.monotonic(), members)
        assert {m.name: (m.assigns, m.revokes, frozenset(m.assignment)) for m in (s1, s2)} == callbacks
        assert (restarted.assigns, restarted.revokes) == (1, 0)

        description = describe_group(bootstrap, group)
        assert description.state == ConsumerGroupState.STABLE
        by_instance = {m.group_instance_id: m for m in description.members}
        assert set(by_instance) == {"s1", "s2", "s3"}
        # The restarted consumer took over the instance's membership under a
        # new member id (Kafka keeps the old member's client id and host).
        assert {i: m.member_id for i, m in by_instance.items()} == {
            "s1": s1.consumer.memberid(),
            "s2": s2.consumer.memberid(),
            "s3": restarted.consumer.memberid(),
        }
        assert restarted.consumer.memberid() != s3_member_id
        assert {tp.partition for tp in by_instance["s3"].assignment.topic_partitions} == s3_partitions
    finally:
        close_all(members)

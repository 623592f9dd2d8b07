"""Exactly-once consume-transform-produce through a coordinator crash
(issue #16).

100,000 records are copied from an input topic to an output topic by one
confluent-kafka loop: a read_committed consumer in a group, a transactional
producer, one transaction per batch with the consumed positions
(send_offsets_to_transaction). On the way one transaction is aborted on
purpose after its records were written; the gateway coordinating the
transactional id (FindCoordinator key type 1) is SIGKILLed mid-transaction
(with records in flight); a new gateway is started; and the id's
coordinator then is SIGKILLed between send_offsets_to_transaction and
commit_transaction. The killed gateways may coordinate the group too. The loop
handles errors as confluent-kafka's EOS example does: retriable -> call
again; abortable -> abort_transaction and rewind the consumer to the
group's committed offsets; fatal -> a new producer (init_transactions) and
rewind; a rebalance (the group's coordinator may die too) -> abort and
rewind. At the end read_committed consumers of the output see every input
record exactly once, in the input's order per partition, and the group's
committed offsets are the input's end offsets; read_uncommitted consumers
see the aborted copies too.

Gateways run with TXN_SETTINGS (test_transactions.py). Clients bootstrap
with every gateway's address. Progress is printed (shown on failure), with
the gateways' logs (printed by ketch_cluster's teardown); a client call
that takes over 2 s is logged, and one stuck for 40 s (past its own
timeout) gets every thread's stack and the gateways' logs printed.
"""

import collections
import faulthandler
import os
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from test_transactions import (
    COMMITTED,
    TXN_SETTINGS,
    UNCOMMITTED,
    clients,  # noqa: F401 (a fixture)
    committed_offsets,
    create_topic,
    find_coordinator,
    high_watermarks,
    stable_offsets,
)

TOTAL = 100_000
PARTITIONS = 4
TXN_RECORDS = 2_000
ABORT_AT = 15_000  # records committed before one transaction is aborted on purpose
FIRST_KILL_AT = 30_000  # records committed before the first kill (mid-transaction)
RESTART_AT = 50_000  # a new gateway joins
SECOND_KILL_AT = 70_000  # the coordinator is killed between offsets and commit
DEADLINE = 75.0  # the whole copy loop; it takes ~8-20 s with a debug build


def value_of(i):
    """A 100-byte value naming record i."""
    return f"{i:08d}:".encode().ljust(100, b".")


class Log:
    def __init__(self):
        self.start = time.monotonic()

    def __call__(self, what):
        print(f"[{time.monotonic() - self.start:7.2f}s] {what}", flush=True)


class Watchdog:
    """Prints every thread's stack and every gateway's log so far if the
    copy loop is stuck in one call for `stall` seconds (every client call it
    makes has a timeout well below that)."""

    def __init__(self, gateways, log, stall=40.0):
        self.gateways, self.log, self.stall = gateways, log, stall
        self.since, self.what, self.fired = time.monotonic(), "start", []
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def entering(self, what):
        self.since, self.what = time.monotonic(), what

    def _run(self):
        while not self.stopped.wait(1.0):
            stuck = time.monotonic() - self.since
            if stuck > self.stall and self.what not in self.fired:
                self.fired.append(self.what)
                self.log(f"WATCHDOG: stuck in {self.what} for {stuck:.0f} s")
                faulthandler.dump_traceback(all_threads=True)
                for g in self.gateways:
                    print(f"--- {g.process.name} log so far ---\n{g.process.output()}", flush=True)

    def close(self):  # the clients fixture closes it at teardown
        self.stopped.set()


def read_all(bootstrap, topic, ends, isolation, timeout=60.0):
    """{partition: [value, ...]} read from offset 0 until each partition p
    reported its end (enable.partition.eof) at ends[p] or later."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # no subscribe(), no commits
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.max.bytes": 8 << 20,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        records = {p: [] for p in ends}
        eof = {p: None for p in ends}
        deadline = time.monotonic() + timeout
        while not all(eof[p] is not None and eof[p] >= end for p, end in ends.items()):
            assert time.monotonic() < deadline, (
                f"{topic} {isolation}: ends {eof} after {timeout} s, want {ends}; "
                f"records so far { {p: len(r) for p, r in records.items()} }"
            )
            for msg in consumer.consume(10_000, 0.5):
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, f"{topic} {isolation}: {msg.error()}"
                    eof[msg.partition()] = msg.offset()
                else:
                    records[msg.partition()].append(msg.value())
        return records
    finally:
        consumer.close()


def coordinator_of(gateways, txn_id, log):
    """The live gateway every live gateway names as `txn_id`'s coordinator
    (retried while they disagree, e.g. right after a gateway joined or
    died)."""
    live = [g for g in gateways if not g.killed]
    deadline = time.monotonic() + 15
    while True:
        answers = {}
        for g in live:
            try:
                answers[g.node_id] = find_coordinator(g.bootstrap, txn_id, 1)
            except (OSError, AssertionError) as e:
                answers[g.node_id] = repr(e)
        names = set(answers.values())
        if len(names) == 1:
            error, node = next(iter(names))
            if error == 0 and any(g.node_id == node for g in live):
                return next(g for g in live if g.node_id == node)
        assert time.monotonic() < deadline, f"FindCoordinator(transaction {txn_id}) answers {answers}"
        log(f"FindCoordinator(transaction) answers {answers}; asking again")
        time.sleep(0.3)


def test_consume_transform_produce_survives_coordinator_sigkill(ketch_cluster, topic_name, clients):  # noqa: F811
    """The module's scenario: 100,000 records copied exactly once through an
    abort on purpose and two SIGKILLs of the transaction's coordinator."""
    log = Log()
    gateways = ketch_cluster(3, settings=TXN_SETTINGS)
    bootstrap = ",".join(g.bootstrap for g in gateways)
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    partitions = range(PARTITIONS)

    # --- the input: 100,000 records, round-robin over the partitions
    plain = clients(
        Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "acks": "all"})
    )
    failed = []

    def on_input(err, msg):
        if err is not None:
            failed.append(err)

    for i in range(TOTAL):
        while True:
            try:
                plain.produce(source, value=value_of(i), key=b"%d" % i, partition=i % PARTITIONS, on_delivery=on_input)
                break
            except BufferError:
                plain.poll(0.05)
    assert plain.flush(60) == 0 and not failed, f"input: {failed[:5]}"
    in_ends = high_watermarks(bootstrap, source, partitions)
    assert sum(in_ends.values()) == TOTAL, in_ends
    log(f"input written: {in_ends}")

    # --- the loop
    txn_id, group = f"{topic_name}-txn", f"{topic_name}-g"
    rebalanced = []
    stats = collections.Counter()

    def on_assign(consumer, tps):
        log(f"assigned {[tp.partition for tp in tps]}")
        rebalanced.append("assign")

    def on_revoke(consumer, tps):
        log(f"revoked {[tp.partition for tp in tps]}")
        rebalanced.append("revoke")

    def on_lost(consumer, tps):
        log(f"lost {[tp.partition for tp in tps]}")
        rebalanced.append("lost")

    def on_error(who):
        def report(error):
            stats[f"{who} error_cb {error.name()}"] += 1
            log(f"{who} error_cb: {error} (fatal {error.fatal()})")

        return report

    consumer = clients(
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "error_cb": on_error("consumer"),
                "group.id": group,
                "isolation.level": COMMITTED,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
    )
    consumer.subscribe([source], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def new_producer():
        producer = clients(
            Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "error_cb": on_error("producer"),
                    "transactional.id": txn_id,
                    "linger.ms": 5,
                    "transaction.timeout.ms": 20000,
                    # librdkafka (2.16) waits for a state change of some
                    # broker connection before it looks up a group
                    # coordinator again, and send_offsets_to_transaction
                    # ignores its timeout meanwhile (librdkafka issues
                    # #5456, #5511): a cached group coordinator that was
                    # killed and left the Metadata blocks it for good.
                    # Closing idle connections makes such a state change.
                    "connections.max.idle.ms": 3000,
                    **({"debug": os.environ["TXN_CRASH_DEBUG"]} if os.environ.get("TXN_CRASH_DEBUG") else {}),
                }
            )
        )
        retry(lambda: producer.init_transactions(10), "init_transactions")
        return producer

    def retry(call, what):
        """Calls `call` until it does not raise a retriable KafkaException."""
        deadline = time.monotonic() + 60
        while True:
            watchdog.entering(what)
            began = time.monotonic()
            try:
                result = call()
                if time.monotonic() - began > 2:
                    log(f"{what} took {time.monotonic() - began:.1f} s")
                return result
            except KafkaException as e:
                error = e.args[0]
                if not error.retriable() or time.monotonic() > deadline:
                    raise
                stats[f"retriable {what}: {error.name()}"] += 1
                log(f"{what}: retriable {error}; again")

    def rewind():
        """Seeks the consumer to the group's committed offsets (the start
        for a partition without one)."""
        assignment = consumer.assignment()
        if not assignment:
            return
        deadline = time.monotonic() + 30
        while True:
            try:
                watchdog.entering("consumer.committed")
                committed = consumer.committed(assignment, timeout=10)
                break
            except KafkaException as e:
                assert time.monotonic() < deadline, f"committed(): {e}"
                log(f"committed(): {e}; again")
        for tp in committed:
            if tp.offset < 0:
                tp.offset = OFFSET_BEGINNING
            try:
                consumer.seek(tp)
            except KafkaException as e:  # not fetching yet: it starts from the committed offset anyway
                log(f"seek {tp}: {e}")
        log(f"rewound to { {tp.partition: tp.offset for tp in committed} }")

    watchdog = clients(Watchdog(gateways, log))
    producer = new_producer()
    copied = 0  # records in committed transactions (counted by this loop)
    killed = restarted = False
    second_killed = False
    aborted_on_purpose = 0
    started = time.monotonic()
    last_report = 0.0

    while True:
        assert time.monotonic() - started < DEADLINE, f"copy loop still running after {DEADLINE} s; {dict(stats)}"
        # Recreated or aborted: a transaction is begun here only.
        try:
            watchdog.entering("begin_transaction")
            producer.begin_transaction()
        except KafkaException as e:
            log(f"begin_transaction: {e}; new producer")
            stats["begin failed"] += 1
            producer = new_producer()
            rewind()
            continue
        rebalanced.clear()
        batch = 0
        idle_polls = 0
        trouble = None
        kill_now = not killed and copied >= FIRST_KILL_AT
        try:
            while batch < TXN_RECORDS:
                watchdog.entering("consume")
                msgs = consumer.consume(min(500, TXN_RECORDS - batch), 0.5)
                if rebalanced:
                    trouble = f"rebalance {rebalanced}"
                    break
                if not msgs:
                    idle_polls += 1
                    if idle_polls >= 4:  # nothing left (or nothing yet): end this transaction
                        break
                    continue
                for m in msgs:
                    if m.error():
                        if m.error().fatal():
                            raise KafkaException(m.error())
                        log(f"consumer: {m.error()}")
                        continue
                    while True:
                        try:
                            producer.produce(sink, value=m.value(), key=m.key(), partition=m.partition())
                            break
                        except BufferError:
                            producer.poll(0.05)
                batch += sum(1 for m in msgs if not m.error())
                producer.poll(0)
                if kill_now and batch >= TXN_RECORDS // 2:
                    victim = coordinator_of(gateways, txn_id, log)
                    log(f"SIGKILL node {victim.node_id} ({victim.bootstrap}), the coordinator of {txn_id}, "
                        f"mid-transaction ({batch} records produced, {copied} committed)")
                    victim.kill()
                    killed, kill_now = True, False
            if trouble is None and not aborted_on_purpose and copied >= ABORT_AT and batch:
                # Written, then aborted: read_uncommitted sees these copies, read_committed must not.
                assert producer.flush(15) == 0, "records of the transaction to abort not delivered"
                aborted_on_purpose = batch
                trouble = f"on purpose, after its {batch} records were written"
            if trouble is None:
                positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
                retry(
                    lambda: producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 15),
                    "send_offsets_to_transaction",
                )
                if restarted and not second_killed and copied >= SECOND_KILL_AT:
                    victim = coordinator_of(gateways, txn_id, log)
                    log(f"SIGKILL node {victim.node_id} ({victim.bootstrap}), the coordinator of {txn_id}, "
                        f"between send_offsets_to_transaction and commit_transaction ({copied} committed)")
                    victim.kill()
                    second_killed = True
                retry(lambda: producer.commit_transaction(15), "commit_transaction")
                copied += batch
                stats["committed"] += 1
                stats["empty commits"] += batch == 0
        except KafkaException as e:
            error = e.args[0]
            trouble = f"{error.name()} ({error}; fatal {error.fatal()}, abortable {error.txn_requires_abort()})"
            if error.fatal():
                log(f"fatal: {trouble}; new producer")
                stats[f"fatal {error.name()}"] += 1
                producer = new_producer()
                rewind()
                continue
        if trouble is not None:
            log(f"aborting a transaction of {batch} records: {trouble}")
            stats["aborted"] += 1
            try:
                retry(lambda: producer.abort_transaction(15), "abort_transaction")
            except KafkaException as e:
                log(f"abort_transaction: {e}; new producer")
                stats["abort failed"] += 1
                producer = new_producer()
            rewind()
            continue

        now = time.monotonic()
        if now - last_report > 2:
            last_report = now
            log(f"copied {copied}, {dict(stats)}")
        if killed and not restarted and copied >= RESTART_AT:
            (joined,) = ketch_cluster(1, settings=TXN_SETTINGS)
            gateways.append(joined)
            restarted = True
            log(f"node {joined.node_id} ({joined.bootstrap}) joined; the coordinator of {txn_id} is now "
                f"node {coordinator_of(gateways, txn_id, log).node_id}")
        if batch == 0:
            watchdog.entering("committed_offsets")
            offsets = committed_offsets(bootstrap, group, source, partitions)
            if offsets == in_ends:
                break
            log(f"idle with the group's offsets at {offsets}, want {in_ends}; {copied} copied")
    watchdog.close()
    elapsed = time.monotonic() - started
    log(f"copy loop done in {elapsed:.1f} s: {copied} records in committed transactions, {dict(stats)}")
    assert aborted_on_purpose and killed and restarted and second_killed, (
        aborted_on_purpose, killed, restarted, second_killed)

    # --- the checks
    live = ",".join(g.bootstrap for g in gateways if not g.killed)
    assert committed_offsets(live, group, source, partitions) == in_ends
    deadline = time.monotonic() + 20
    while True:
        out_ends = high_watermarks(live, sink, partitions)
        stable = stable_offsets(live, sink, partitions)
        if stable == out_ends:
            break
        assert time.monotonic() < deadline, f"output: LSO {stable} below HW {out_ends} 20 s after the loop ended"
        time.sleep(0.2)
    log(f"output ends {out_ends}")

    inputs = read_all(live, source, in_ends, COMMITTED)
    outputs = read_all(live, sink, out_ends, COMMITTED)
    want = collections.Counter(v for p in partitions for v in inputs[p])
    assert len(want) == TOTAL and sum(want.values()) == TOTAL, "the input holds 100,000 distinct records"
    got = collections.Counter(v for p in partitions for v in outputs[p])
    duplicates = sorted(v[:8].decode() for v, n in got.items() if n > 1)
    missing = sorted(v[:8].decode() for v in want.keys() - got.keys())
    foreign = sorted(v[:8] for v in got.keys() - want.keys())
    log(f"read_committed output: {sum(got.values())} records, {len(got)} distinct, "
        f"{len(duplicates)} duplicated, {len(missing)} missing, {len(foreign)} foreign")
    assert not duplicates and not missing and not foreign, (
        f"read_committed output: {sum(got.values())} records; duplicated {len(duplicates)} {duplicates[:10]}; "
        f"missing {len(missing)} {missing[:10]}; foreign {foreign[:10]}"
    )
    for p in partitions:
        if outputs[p] != inputs[p]:
            at = next((i for i, (a, b) in enumerate(zip(outputs[p], inputs[p])) if a != b), None)
            at = min(len(outputs[p]), len(inputs[p])) if at is None else at
            raise AssertionError(
                f"partition {p}: the output ({len(outputs[p])} records) is not the input ({len(inputs[p])}) in "
                f"order; first difference at index {at}: output {outputs[p][at:at + 1]}, input {inputs[p][at:at + 1]}"
            )

    everything = read_all(live, sink, out_ends, UNCOMMITTED)
    total_uncommitted = sum(len(r) for r in everything.values())
    log(f"read_uncommitted output: {total_uncommitted} records (aborted copies included)")
    assert total_uncommitted >= TOTAL + aborted_on_purpose
    assert set(v for p in partitions for v in everything[p]) == set(want)

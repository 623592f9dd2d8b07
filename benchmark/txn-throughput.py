#!/usr/bin/env python3
"""What transactions cost a producer (issue #16): idempotent vs transactional
produce throughput, with confluent-kafka (librdkafka), in one run.

Each round produces --records records of --size bytes (random, incompressible,
no compression), round-robin over --partitions partitions, acks=all, twice:

  idempotent     enable.idempotence=true, one flush at the end;
  transactional  transactional.id set, one transaction per --txn-records
                 records (begin, produce, commit_transaction, which waits
                 for every record of the transaction and the markers).

Each mode writes to its own fresh topic (created before, deleted after
unless --keep-topics). The order alternates per round (ABBA...), so drift on
a shared machine hits both modes alike. The clock runs from the first
produce() to the end of the last flush/commit; producer start-up
(connections, metadata, the producer id, init_transactions, and one warm-up
record per partition, committed in a transaction by the transactional
producer) is outside it, so a topic holds --records + --partitions records. Both modes use
linger.ms=5, batch.size=1 MiB (librdkafka also caps a batch at
message.max.bytes, 1,000,000 by default) and large queue limits.

Prints a table (records/s and MiB/s per mode per round, commit latencies,
the client's CPU seconds: a client near 1 CPU second per second is the
bottleneck, not the broker; the Python thread's own CPU seconds near the
elapsed ones say the same) and the ratio transactional/idempotent, per
round and overall (median over rounds of each mode); --json FILE writes all
of it. Target: ratio >= 0.70.

    benchmark/txn-throughput.py --bootstrap 127.0.0.1:9092
    benchmark/txn-throughput.py --bootstrap 127.0.0.1:9092 --records 500000 --rounds 4 --json out.json

Exit status: 0, or 1 if a record was not delivered or a transaction failed,
or 3 with --strict if the overall ratio is below --target.
"""

import argparse
import json
import os
import statistics
import sys
import time
import uuid

import confluent_kafka
from confluent_kafka import KafkaException, Producer, libversion
from confluent_kafka.admin import AdminClient, NewTopic

MODES = ("idempotent", "transactional")

# Both modes: the settings. queue.buffering.max.* are librdkafka's
# local queue (records not yet acknowledged), large enough never to block
# produce() for these record counts.
COMMON = {
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 1 << 20,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 4 << 20,  # 4 GiB
    "compression.type": "none",
    # Delivery reports only for failures: no Python callback per record.
    "delivery.report.only.error": True,
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="bootstrap.servers, host:port[,host:port...]")
    p.add_argument("--records", type=int, default=200_000, help="records per mode per round (default 200000)")
    p.add_argument("--size", type=int, default=1024, help="value bytes per record (default 1024)")
    p.add_argument("--partitions", type=int, default=16, help="partitions of each topic (default 16)")
    p.add_argument("--txn-records", type=int, default=1000, help="records per transaction (default 1000)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, each running both modes (default 2)")
    p.add_argument("--topic-prefix", default=None, help="topic name prefix (default txn-bench-<random>)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--keep-topics", action="store_true", help="do not delete the topics after each measurement")
    p.add_argument("--target", type=float, default=0.70, help="target ratio transactional/idempotent (default 0.70)")
    p.add_argument("--strict", action="store_true", help="exit 3 if the overall ratio is below --target")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one measurement may take (default 600)")
    p.add_argument(
        "-X", dest="extra", action="append", default=[], metavar="KEY=VALUE",
        help="extra librdkafka property for both modes (repeatable; e.g. -X security.protocol=SSL)",
    )
    args = p.parse_args(argv)
    for name in ("records", "size", "partitions", "txn_records", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.topic_prefix is None:
        args.topic_prefix = f"txn-bench-{uuid.uuid4().hex[:8]}"
    extra = {}
    for item in args.extra:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"-X {item}: want KEY=VALUE")
        extra[key] = value
    args.extra = extra
    return args


def log(message):
    print(message, file=sys.stderr, flush=True)


class Admin:
    def __init__(self, bootstrap, extra):
        self.client = AdminClient({"bootstrap.servers": bootstrap, **extra})

    def create(self, topic, partitions):
        self.client.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[topic].result(60)
        deadline = time.monotonic() + 30
        while True:  # until Metadata lists every partition with a leader
            meta = self.client.list_topics(topic, timeout=10).topics.get(topic)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions:
                if all(p.leader >= 0 for p in meta.partitions.values()):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic}: metadata {meta} 30 s after creating it")
            time.sleep(0.1)

    def delete(self, topic):
        try:
            self.client.delete_topics([topic], operation_timeout=30)[topic].result(60)
        except KafkaException as e:
            log(f"deleting {topic}: {e}")


def payloads(size, count=64):
    """`count` distinct random values of `size` bytes (random: compression,
    were it on, could not shrink them)."""
    return [os.urandom(size) for _ in range(count)]


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def produce_all(producer, topic, count, start, partitions, pool):
    """produce() records start..start+count-1 (partition = index mod
    partitions), serving the queue when it is full. Positional arguments
    and local names: this loop is the client's main cost."""
    produce, poll = producer.produce, producer.poll
    npool = len(pool)
    i, end = start, start + count
    while i < end:
        stop = min(end, i + 1000)
        try:
            for i in range(i, stop):
                produce(topic, pool[i % npool], None, i % partitions)
            i = stop
        except BufferError:  # record i was not queued: serve, then retry it
            poll(0.005)
        poll(0)


def measure(mode, args, topic, round_no, pool):
    """Produces args.records records to `topic` in `mode`; returns the
    measurement as a dict."""
    delivery_errors = []
    fatal = []

    def on_delivery(err, msg):
        if err is not None:
            delivery_errors.append(str(err))

    def on_error(err):
        if err.fatal():
            fatal.append(str(err))
        log(f"  [{mode}] client error: {err}")

    config = {
        "bootstrap.servers": args.bootstrap,
        **COMMON,
        **args.extra,
        "on_delivery": on_delivery,
        "error_cb": on_error,
    }
    if mode == "idempotent":
        config["enable.idempotence"] = True
    else:
        config["transactional.id"] = f"{topic}-txn"
        # The transaction must outlive a slow commit on a loaded machine.
        config.setdefault("transaction.timeout.ms", 60_000)
    producer = Producer(config)
    # Outside the clock: connections, the topic's metadata, the producer id
    # (librdkafka gets an idempotent producer's id in the background, and
    # records wait for it), one record per partition (a transaction of them)
    # so that every partition leader's connection is up.
    producer.list_topics(topic, timeout=30)
    if mode == "transactional":
        producer.init_transactions(60)
        producer.begin_transaction()
    for p in range(args.partitions):
        producer.produce(topic, value=pool[p % len(pool)], partition=p)
    if mode == "transactional":
        producer.commit_transaction(60)
    elif producer.flush(60):
        raise RuntimeError(f"{mode}: warm-up records not delivered")

    commits = []
    transactions = 0
    cpu0, py0 = time.process_time(), time.thread_time()
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    if mode == "idempotent":
        produce_all(producer, topic, args.records, 0, args.partitions, pool)
        remaining = producer.flush(max(1.0, deadline - time.monotonic()))
        if remaining:
            raise RuntimeError(f"{mode}: {remaining} records not delivered within --timeout")
    else:
        done = 0
        while done < args.records:
            n = min(args.txn_records, args.records - done)
            producer.begin_transaction()
            produce_all(producer, topic, n, done, args.partitions, pool)
            c0 = time.monotonic()
            producer.commit_transaction(max(1.0, deadline - c0))
            commits.append(time.monotonic() - c0)
            done += n
            transactions += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: --timeout after {done} records")
    elapsed = time.monotonic() - t0
    cpu, py = time.process_time() - cpu0, time.thread_time() - py0
    producer.poll(0)
    producer.flush(10)
    if delivery_errors or fatal:
        raise RuntimeError(f"{mode}: delivery errors {delivery_errors[:5]} ({len(delivery_errors)}), fatal {fatal}")
    result = {
        "round": round_no,
        "mode": mode,
        "topic": topic,
        "records": args.records,
        "bytes": args.records * args.size,
        "seconds": elapsed,
        "records_per_s": args.records / elapsed,
        "mib_per_s": args.records * args.size / elapsed / (1 << 20),
        # CPU seconds of the whole client process (librdkafka's threads
        # included) and of the Python thread calling produce(): the latter
        # near `seconds` means the client, not the broker, set the pace.
        "client_cpu_s": cpu,
        "python_thread_cpu_s": py,
        "transactions": transactions,
    }
    if commits:
        result["commit_ms"] = {
            "p50": percentile(commits, 0.50) * 1000,
            "p99": percentile(commits, 0.99) * 1000,
            "max": max(commits) * 1000,
            "mean": statistics.fmean(commits) * 1000,
        }
    return result


def table(results, ratios, summary, args):
    lines = []
    header = f"{'round':>5}  {'mode':<13}  {'records':>9}  {'seconds':>8}  {'records/s':>10}  {'MiB/s':>7}  " \
             f"{'txns':>5}  {'commit p50/p99/max ms':>22}  {'client cpu s':>12}  {'python cpu s':>12}"
    lines.append(header)
    lines.append("-" * len(header))
    for r in results:
        c = r.get("commit_ms")
        commit = f"{c['p50']:.1f}/{c['p99']:.1f}/{c['max']:.1f}" if c else "-"
        lines.append(
            f"{r['round']:>5}  {r['mode']:<13}  {r['records']:>9}  {r['seconds']:>8.2f}  {r['records_per_s']:>10.0f}  "
            f"{r['mib_per_s']:>7.1f}  {r['transactions'] or '-':>5}  {commit:>22}  {r['client_cpu_s']:>12.2f}  "
            f"{r['python_thread_cpu_s']:>12.2f}"
        )
    lines.append("")
    for round_no, ratio in ratios.items():
        lines.append(f"round {round_no}: transactional/idempotent = {ratio:.3f}")
    met = "met" if summary["ratio"] >= args.target else "NOT met"
    lines.append(
        f"overall (median records/s: transactional {summary['median_records_per_s']['transactional']:.0f}, "
        f"idempotent {summary['median_records_per_s']['idempotent']:.0f}): ratio {summary['ratio']:.3f} "
        f"(target >= {args.target:.2f}: {met})"
    )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    log(
        f"confluent-kafka {confluent_kafka.__version__}, librdkafka {libversion()[0]}; {args.bootstrap}: {args.rounds} round(s) x "
        f"{args.records} records of {args.size} B over {args.partitions} partitions, transactions of "
        f"{args.txn_records}; topics {args.topic_prefix}-*"
    )
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    admin = Admin(args.bootstrap, args.extra)
    pool = payloads(args.size)
    results = []
    try:
        for round_no in range(1, args.rounds + 1):
            order = MODES if round_no % 2 else tuple(reversed(MODES))
            for mode in order:
                topic = f"{args.topic_prefix}-r{round_no}-{mode}"
                admin.create(topic, args.partitions)
                try:
                    r = measure(mode, args, topic, round_no, pool)
                finally:
                    if not args.keep_topics:
                        admin.delete(topic)
                results.append(r)
                log(
                    f"round {round_no} {mode}: {r['records_per_s']:.0f} records/s, {r['mib_per_s']:.1f} MiB/s "
                    f"({r['seconds']:.2f} s, client CPU {r['client_cpu_s']:.2f} s, "
                    f"of which the Python thread {r['python_thread_cpu_s']:.2f} s)"
                )
    except Exception as e:  # KafkaException, RuntimeError, a future's TimeoutError: report, exit 1
        log(f"failed: {type(e).__name__}: {e}")
        return 1

    rate = {(r["round"], r["mode"]): r["records_per_s"] for r in results}
    ratios = {n: rate[(n, "transactional")] / rate[(n, "idempotent")] for n in range(1, args.rounds + 1)}
    medians = {m: statistics.median(r["records_per_s"] for r in results if r["mode"] == m) for m in MODES}
    summary = {
        "median_records_per_s": medians,
        "ratio": medians["transactional"] / medians["idempotent"],
        "ratio_per_round": ratios,
        "target": args.target,
    }
    summary["target_met"] = summary["ratio"] >= args.target
    print(table(results, ratios, summary, args))

    if args.json:
        document = {
            "benchmark": "txn-throughput",
            "started": started,
            "client": {"confluent_kafka": confluent_kafka.__version__, "librdkafka": libversion()[0]},
            "params": {
                "bootstrap": args.bootstrap,
                "records": args.records,
                "size": args.size,
                "partitions": args.partitions,
                "txn_records": args.txn_records,
                "rounds": args.rounds,
                "topic_prefix": args.topic_prefix,
                "producer_config": {**COMMON, **args.extra},
            },
            "results": results,
            "summary": {**summary, "ratio_per_round": {str(k): v for k, v in ratios.items()}},
        }
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
        os.replace(tmp, args.json)
        log(f"wrote {args.json}")
    if args.strict and not summary["target_met"]:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

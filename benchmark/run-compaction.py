#!/usr/bin/env python3
"""The compaction benchmark (issue 17), in one run on one machine.

1. A fresh redis-server and a release `ketch` (storage worker ticking every
   100 ms); a compacted topic of one partition whose segment is not sealed
   yet (segment.ms 1 hour, segment.bytes 2 GiB).
2. Baseline: RECORDS records of VALUE_BYTES random bytes over RECORDS/10
   keys (10 % distinct) are produced with confluent-kafka (acks=all, linger
   5 ms, 1 MiB batches), timed: produce throughput with no compaction running.
3. segment.ms is set to 1 ms (IncrementalAlterConfigs): the worker seals the
   segment and compacts the partition, while more records (the same keys)
   are produced until the pass ends (DURING at most), timed: produce
   throughput during compaction. The pass is
   timed until the meta field clean_end covers the sealed segment, and its
   records read per second of the pass (`ketch_compaction_seconds`).
4. Redis's SLOWLOG (every command over 1 ms, from just before the seal to
   the end of the pass): the longest command, and the longest of the
   compaction's own (XRANGE, XTRIM, RENAME, UNLINK, the two scripts).

Writes OUT/compaction.json and OUT/slowest.txt (the 30 longest commands)
and prints a summary. Environment: RECORDS
(1000000), VALUE_BYTES (1024), DURING (300000), OUT
(benchmark/results/<date>/compaction; DURING=0 times the pass alone), BENCH_KETCH_BIN (a gateway binary;
default target/release/ketch, built with `cargo build --release -p
ketch-gateway`).
"""

import hashlib
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from servers import Servers, produce_records

REPO = pathlib.Path(__file__).resolve().parent.parent
RECORDS = int(os.environ.get("RECORDS", 1_000_000))
VALUE_BYTES = int(os.environ.get("VALUE_BYTES", 1024))
DURING = int(os.environ.get("DURING", 300_000))
KEYS = max(1, RECORDS // 10)
OUT = pathlib.Path(os.environ.get("OUT", REPO / "benchmark" / "results" / time.strftime("%Y-%m-%d") / "compaction"))
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
KETCH = os.environ.get("BENCH_KETCH_BIN", str(TARGET / "release" / "ketch"))
TOPIC = "compacted"


def metric(http, name):
    body = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def produce(bootstrap, first, count, values, stop=None):
    """Produces records first..first+count (key i % KEYS), or until `stop` is
    set; returns (records produced, seconds)."""
    records = ((b"key-%d" % (i % KEYS), values[i % len(values)]) for i in range(first, first + count))
    return produce_records(bootstrap, TOPIC, records, stop=stop)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp())
    env = {**os.environ, "RUST_LOG": "info,ketch_tiering=debug"}
    with Servers(work, OUT, KETCH, ["tiering.tick_interval=100ms"], env) as servers:
        bootstrap, http, redis = servers.bootstrap, servers.http, servers.redis
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={
            "cleanup.policy": "compact", "segment.ms": "3600000", "segment.bytes": "2147483647",
            "max.message.bytes": str(2 << 20)})])[TOPIC].result(30)
        rng = random.Random(17)
        values = [rng.randbytes(VALUE_BYTES) for _ in range(4096)]

        print(f"producing {RECORDS} records of {VALUE_BYTES} B over {KEYS} keys", file=sys.stderr)
        _, base_s = produce(bootstrap, 0, RECORDS, values)
        tags = json.loads(redis("HGET", "ketch:topics", TOPIC))["tags"]
        meta = f"ketch:{{{tags[0]}}}:meta"
        log_key = f"ketch:{{{tags[0]}}}:log"
        log_bytes = int(redis("MEMORY", "USAGE", log_key, "SAMPLES", "0") or 0)

        redis("CONFIG", "SET", "slowlog-log-slower-than", "1000")
        redis("SLOWLOG", "RESET")
        resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC, incremental_configs=[
            ConfigEntry("segment.ms", "1", incremental_operation=AlterConfigOpType.SET)])
        # Produce for as long as the pass runs (DURING records at most).
        stop = threading.Event()
        during = {}
        producing = threading.Thread(target=lambda: during.update(
            result=produce(bootstrap, RECORDS, DURING, values, stop)))
        started = time.monotonic()
        admin.incremental_alter_configs([resource])[resource].result(30)
        if DURING:
            producing.start()
        while int(redis("HGET", meta, "clean_end") or 0) < RECORDS:
            time.sleep(0.02)
            assert time.monotonic() - started < 1800, "compaction did not finish"
        pass_wall_s = time.monotonic() - started
        stop.set()
        if DURING:
            producing.join()
        during_records, during_s = during.get("result", (0, 0.0))
        # The pass counts itself once its trimming is done too.
        while metric(http, "ketch_compaction_passes_total") < 1:
            time.sleep(0.05)
        compaction_s = metric(http, "ketch_compaction_seconds_sum")
        read = metric(http, "ketch_compaction_records_read_total")
        removed = metric(http, "ketch_compaction_records_removed_total")
        passes = metric(http, "ketch_compaction_passes_total")
        clean_bytes = int(redis("HGET", meta, "clean_bytes") or 0)

        entries = parse_slowlog(servers.redis_port)
        longest = max(entries, default=(0, "none"))
        longest_compaction = max((e for e in entries if is_compaction(e[1])), default=(0, "none"))
        result = {
            "records": RECORDS, "value_bytes": VALUE_BYTES, "keys": KEYS, "during": DURING,
            "redis_log_bytes_before": log_bytes,
            "produce_records_per_s_baseline": RECORDS / base_s,
            "produce_records_per_s_during_compaction": during_records / during_s if during_s else None,
            "produced_during_compaction": during_records,
            "compaction_passes": passes, "compaction_records_read": read, "compaction_records_removed": removed,
            "compaction_seconds": compaction_s,
            "compaction_records_per_s": read / compaction_s if compaction_s else None,
            "seal_to_compacted_wall_s": pass_wall_s,
            "clean_bytes_after": clean_bytes,
            "longest_redis_command_us": longest[0], "longest_redis_command": longest[1][:120],
            "longest_compaction_command_us": longest_compaction[0],
            "longest_compaction_command": longest_compaction[1][:120],
            "slowlog_entries_over_1ms": len(entries),
        }
        (OUT / "compaction.json").write_text(json.dumps(result, indent=2) + "\n")
        (OUT / "slowest.txt").write_text(
            "duration_us command (the 30 longest commands over 1 ms)\n"
            + "".join(f"{d} {line}\n" for d, line in sorted(entries, reverse=True)[:30]))
        print(json.dumps(result, indent=2))


# The compaction's own scripts, by the SHA1 Redis names them with.
COMPACTION_SCRIPTS = {
    hashlib.sha1((REPO / "storage" / "src" / "scripts" / name).read_bytes()).hexdigest()
    for name in ("compact_add.lua", "compact_swap.lua")
}


def is_compaction(line):
    """Whether a SLOWLOG command line is the compaction's: its scripts, its
    reads and trims of the log (no consumer runs here), its streams."""
    words = line.split()
    return (words[0].upper() in ("XRANGE", "XTRIM")
            or (words[0].upper() == "EVALSHA" and len(words) > 1 and words[1] in COMPACTION_SCRIPTS)
            or ":compacting" in line or ":clean" in line)


def parse_slowlog(port):
    """(duration µs, command line) of every SLOWLOG entry."""
    out = subprocess.run(["redis-cli", "-p", str(port), "--json", "SLOWLOG", "GET", "100000"],
                         capture_output=True)
    try:
        entries = json.loads(out.stdout.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return []
    result = []
    for entry in entries:
        duration, args = entry[2], entry[3]
        line = " ".join(str(a) for a in args[:4])
        result.append((int(duration), re.sub(r"\s+", " ", line)))
    return result


if __name__ == "__main__":
    main()

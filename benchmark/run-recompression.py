#!/usr/bin/env python3
"""What a topic's compression.type costs (issue 17), in one run.

A fresh redis-server and a release `ketch`; topics of one partition with
compression.type producer (batches stored as sent), zstd, lz4 and gzip. The
producer (confluent-kafka, acks=all, linger 5 ms, 1 MiB batches) sends
RECORDS uncompressed records of VALUE_BYTES of text (compressible: JSON-like
lines) to each in turn, ROUNDS times; each run records the produce rate, the
gateway's CPU time per record (/proc/<pid>/stat) and the bytes the
partition's stream takes in Redis (MEMORY USAGE).

Writes OUT/recompression.json and prints a table. Environment: RECORDS
(200000), VALUE_BYTES (1024), ROUNDS (2), OUT
(benchmark/results/<date>/recompression), BENCH_KETCH_BIN.
"""

import json
import os
import pathlib
import random
import sys
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic
from servers import Servers, produce_records

REPO = pathlib.Path(__file__).resolve().parent.parent
RECORDS = int(os.environ.get("RECORDS", 200_000))
VALUE_BYTES = int(os.environ.get("VALUE_BYTES", 1024))
ROUNDS = int(os.environ.get("ROUNDS", 2))
OUT = pathlib.Path(os.environ.get("OUT", REPO / "benchmark" / "results" / time.strftime("%Y-%m-%d") / "recompression"))
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
KETCH = os.environ.get("BENCH_KETCH_BIN", str(TARGET / "release" / "ketch"))
CODECS = ["producer", "zstd", "lz4", "gzip"]


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def values():
    rng = random.Random(7)
    words = ["order", "customer", "amount", "status", "shipped", "pending", "region", "eu-west", "item", "sku"]
    out = []
    for _ in range(2048):
        line = ""
        while len(line) < VALUE_BYTES:
            line += f'"{rng.choice(words)}": "{rng.choice(words)}-{rng.randrange(100000)}", '
        out.append(line[:VALUE_BYTES].encode())
    return out


def produce(bootstrap, topic, payloads):
    records = ((b"k%d" % i, payloads[i % len(payloads)]) for i in range(RECORDS))
    return produce_records(bootstrap, topic, records, {"compression.type": "none"})[1]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp())
    with Servers(work, OUT, KETCH) as servers:
        admin = AdminClient({"bootstrap.servers": servers.bootstrap})
        payloads = values()
        runs = []
        for round_ in range(ROUNDS):
            for codec in CODECS:
                topic = f"{codec}-{round_}"
                admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": codec})])[topic].result(30)
                cpu = cpu_seconds(servers.ketch.pid)
                took = produce(servers.bootstrap, topic, payloads)
                cpu = cpu_seconds(servers.ketch.pid) - cpu
                tag = json.loads(servers.redis("HGET", "ketch:topics", topic))["tags"][0]
                stored = int(servers.redis("MEMORY", "USAGE", f"ketch:{{{tag}}}:log", "SAMPLES", "0") or 0)
                run = {"round": round_ + 1, "compression.type": codec, "records_per_s": RECORDS / took,
                       "ketch_cpu_us_per_record": cpu / RECORDS * 1e6, "redis_bytes": stored}
                runs.append(run)
                print(json.dumps(run), file=sys.stderr)
        (OUT / "recompression.json").write_text(json.dumps(
            {"records": RECORDS, "value_bytes": VALUE_BYTES, "runs": runs}, indent=2) + "\n")
        print("| compression.type | records/s | ketch CPU µs/record | bytes in Redis |")
        print("|---|---|---|---|")
        for codec in CODECS:
            mine = [r for r in runs if r["compression.type"] == codec]
            span = lambda key, fmt: "–".join(fmt(f(r[key] for r in mine)) for f in (min, max))
            print(f"| {codec} | {span('records_per_s', lambda v: f'{v / 1000:.0f}k')} | "
                  f"{span('ketch_cpu_us_per_record', lambda v: f'{v:.2f}')} | "
                  f"{span('redis_bytes', lambda v: f'{v / 1e6:.0f} MB')} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Two gateway builds' archiving, alternated in one session:
#
#   benchmark/archive-compare.sh BEFORE AFTER DIR [ROUNDS]
#
# runs benchmark/run-archive.sh ROUNDS times (default 3) with each release
# binary in turn (RECORDS random 100 B records, default 1,000,000; zstd, the warehouse on
# the loopback S3 server), results in DIR/<before|after>-<round>, and
# prints per run: partitions, records per second of archiving wall time,
# segments, and the CPU seconds of the gateway and of the S3 server.
# SEGMENT_BYTES (segment size; appended to the directories' names) and TAG
# (their prefix) pass through; so does anything run-archive.sh reads.
set -u
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,12p "$0"; exit 2; }
before=$1 after=$2 dir=$3
mkdir -p "$dir"
for round in $(seq 1 "${4:-3}"); do
    for build in before after; do
        bin=$before; [ $build = after ] && bin=$after
        out=$dir/${TAG:-}$build-$round${SEGMENT_BYTES:+-segments-$SEGMENT_BYTES}
        env -u KETCH_BIN BENCH_KETCH_BIN="$bin" PAYLOAD=random RECORDS="${RECORDS:-1000000}" OUT="$out" \
            benchmark/run-archive.sh >"$out.log" 2>&1 || echo "FAILED $out"
        echo "$build $round: $(grep -h '"measure": "archive"' "$out/archive.jsonl" | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print(r["partitions"], "p", r.get("records_per_archiving_wall_s"), r["segments"], "segments, cpu s ketch",
          r.get("ketch_cpu_s"), "s3", r.get("s3_server_cpu_s"), end=" | ")')"
    done
done

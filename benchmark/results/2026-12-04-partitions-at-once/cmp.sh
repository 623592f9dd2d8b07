#!/usr/bin/env bash
# The archive through the loopback S3 server, before and after a topic's
# archiving task archives two partitions at a time: ROUNDS rounds, binaries alternated, zstd,
# random payload, 1,000,000 records of 100 B. BEFORE and AFTER name the
# two release binaries; TAG prefixes the results' directories.
set -u
cd "$(dirname "$0")/../../.."
base=benchmark/results/2026-12-04-partitions-at-once
for round in $(seq 1 "${ROUNDS:-3}"); do
  for build in before after; do
    bin=$BEFORE; [ $build = after ] && bin=$AFTER
    out=$base/${TAG:-}$build-$round${SEGMENT_BYTES:+-segments-$SEGMENT_BYTES}
    env -u KETCH_BIN BENCH_KETCH_BIN="$bin" KETCH_LOG_LEVEL=info,ketch_tiering::archive=debug \
      PAYLOAD=random RECORDS=1000000 OUT=$out benchmark/run-archive.sh > $out.log 2>&1 || echo "FAILED $out"
    echo "$build $round: $(grep -h '"measure": "archive"' $out/archive.jsonl | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r["partitions"], "p", r.get("records_per_archiving_wall_s"), r["segments"], "segments, cpu s ketch", r.get("ketch_cpu_s"), "s3", r.get("s3_server_cpu_s"), end=" | ")')"
  done
done

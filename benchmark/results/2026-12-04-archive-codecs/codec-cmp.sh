#!/usr/bin/env bash
# Archive codecs alternated: ROUNDS rounds of each payload x codec.
set -u
cd "$(dirname "$0")/../../.."
base=benchmark/results/2026-12-04-archive-codecs
mkdir -p $base
for round in $(seq 1 ${ROUNDS:-2}); do
  for payload in random text; do
    for codec in zstd lz4 snappy; do
      out=$base/$payload-$codec-$round
      env -u KETCH_BIN KETCH_TIERING_COMPRESSION=$codec PAYLOAD=$payload RECORDS=1000000 OUT=$out \
        benchmark/run-archive.sh > $out.log 2>&1 || echo "FAILED $out"
      echo "$payload $codec $round: $(grep -h '"measure": "archive"' $out/archive.jsonl | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r["partitions"], r["records_per_archiving_s"], r["records_per_s"], r["parquet_bytes"], end=" | ")')"
      echo "   consume: $(grep -h '"measure": "consume"' $out/archive.jsonl | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r["tier"], r["records_per_s"], end=" | ")')"
    done
  done
done

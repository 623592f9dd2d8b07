#!/bin/bash
# old vs new ketch-s3 under one gateway build, alternated
cd /work/main
out=$1; rounds=$2
for r in $(seq $rounds); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for side in $order; do
    env -u KETCH_BIN OUT=$out/$side-$r RECORDS=2000000 BENCH_KETCH_BIN=/var/tmp/ketch-chunk BENCH_S3_BIN=/var/tmp/ketch-s3-$side CARGO_TARGET_DIR=/var/tmp/ketch-rel-target benchmark/run-archive.sh > $out/$side-$r.log 2>&1
    grep '"archive"' $out/$side-$r.log | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l)
    if 'partitions' in d: print('$side', $r, d['partitions'], d['records_per_archiving_wall_s'], d['ketch_cpu_s'], d['s3_server_cpu_s'])"
  done
done

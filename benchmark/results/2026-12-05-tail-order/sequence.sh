#!/usr/bin/env bash
# sequence.sh LABEL KETCH_BIN LINGER_MS... : one gateway and one Redis for the
# whole sequence, and per argument a 20 s `ketch-bench roundtrip` at 10,000
# records/s of 1 KiB to a new 16-partition topic with that linger.ms; prints
# a TSV line per run (columns as in sequence.tsv). KETCH_BENCH: the bench binary.
set -euo pipefail
label=$1; bin=$2; shift 2
out=/tmp/seq3; mkdir -p $out
B=${KETCH_BENCH:-target/release/ketch-bench}
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rp=$(fp); kp=$(fp)
redis-server --port $rp --bind 127.0.0.1 --save "" --appendonly no > $out/redis.log 2>&1 & rpid=$!
trap 'kill $rpid 2>/dev/null' EXIT
until grep -q "Ready to accept" $out/redis.log; do sleep 0.05; done
env -u KETCH_BIN $bin serve --listen 127.0.0.1:$kp --http-listen 127.0.0.1:$(fp) --redis-url redis://127.0.0.1:$rp > $out/ketch.log 2>&1 & kpid=$!
trap 'kill $kpid $rpid 2>/dev/null' EXIT
until grep -qs "ketch serving" $out/ketch.log; do sleep 0.05; done
n=0
for linger in "$@"; do
  n=$((n+1))
  redis-cli -p $rp config resetstat >/dev/null
  $B roundtrip --bootstrap-server 127.0.0.1:$kp --workload 1-topic-16-partitions-1kb --topic t-$RANDOM --create-topic --rate 10000 --duration 20s --linger-ms $linger --output json --quiet --server-pid $kpid --server-pid $rpid --result-file $out/r.json > /dev/null
  calls() { redis-cli -p $rp info commandstats | tr -d '\r' | awk -F'[:,=]' -v c="cmdstat_$1" '$1==c{print $3}'; }
  x=$(calls xrange); h=$(calls hmget)
  python3 -c "
import json; r=json.load(open('$out/r.json')); s=r['server']; res=r['results']
p=[q['cpu_s'] for q in s['processes']]
print('\t'.join(map(str,['$label',$n,$linger,round(s['cpu_us_per_record'],2),p[0],p[1],'${x:-0}','${h:-0}',res['produce']['latency']['p99_ms'],res['end_to_end_latency']['p99_ms']])))"
done
kill $kpid $rpid; wait $kpid $rpid 2>/dev/null || true

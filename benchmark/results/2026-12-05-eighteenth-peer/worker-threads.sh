#!/usr/bin/env bash
# /tmp/threads-lat.sh KETCH_BIN ROUNDS OUT: 10k rec/s, linger 1: ketch (2 threads), ketch (1 thread), nisshi; fresh servers, alternated
set -euo pipefail
bin=$1; rounds=$2; out=$3; mkdir -p $out
B=/var/tmp/ketch-rel-target/release/ketch-bench
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
echo -e "round\tserver\tcpu_us_rec\tproduce_p99\te2e_p99"
for r in $(seq $rounds); do
  for threads in 0 1; do
    rp=$(fp); kp=$(fp)
    redis-server --port $rp --bind 127.0.0.1 --save "" --appendonly no > $out/redis.log 2>&1 & rpid=$!
    until grep -q "Ready to accept" $out/redis.log; do sleep 0.05; done
    env -u KETCH_BIN KETCH_BROKER_WORKER_THREADS=$threads $bin serve --listen 127.0.0.1:$kp --http-listen 127.0.0.1:$(fp) --redis-url redis://127.0.0.1:$rp > $out/ketch.log 2>&1 & kpid=$!
    until grep -qs "ketch serving" $out/ketch.log; do sleep 0.05; done
    $B roundtrip --bootstrap-server 127.0.0.1:$kp --workload 1-topic-16-partitions-1kb --topic t --create-topic --rate 10000 --duration 20s --linger-ms 1 --output json --quiet --server-pid $kpid --server-pid $rpid --result-file $out/ketch$threads-$r.json > /dev/null
    kill $kpid $rpid; wait $kpid $rpid 2>/dev/null || true
  done
  np=$(fp)
  /tmp/nisshi-target/release/nisshi broker --storage-engine=memory://nisshi/ --listener-url=tcp://127.0.0.1:$np --advertised-listener-url=tcp://127.0.0.1:$np > $out/nisshi.log 2>&1 & npid=$!
  until python3 -c "import socket; socket.create_connection(('127.0.0.1',$np),0.2)" 2>/dev/null; do sleep 0.1; done
  $B roundtrip --bootstrap-server 127.0.0.1:$np --workload 1-topic-16-partitions-1kb --topic t --create-topic --rate 10000 --duration 20s --linger-ms 1 --output json --quiet --server-pid $npid --result-file $out/nisshi-$r.json > /dev/null
  kill $npid; wait $npid 2>/dev/null || true
  for s in ketch0 ketch1 nisshi; do python3 -c "
import json; r=json.load(open('$out/$s-$r.json')); p=r['results']['produce']['latency']; e=r['results']['end_to_end_latency']
name={'ketch0':'ketch, worker_threads=0 (2)','ketch1':'ketch, worker_threads=1','nisshi':'nisshi'}['$s']
print('\t'.join(map(str,[$r,name,round(r['server']['cpu_us_per_record'],2),p['p99_ms'],e.get('p99_ms')])))"; done
done

#!/bin/bash
# usage: clientab.sh KETCH ROUNDS  -- old vs new bench client on the same gateway build, fresh Redis each run
set -u
bin=$1; rounds=$2
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
one() { # client workload n
  local B=$1 w=$2 n=$3 work rp kp rpid kpid
  work=$(mktemp -d); rp=$(fp); kp=$(fp)
  redis-server --port $rp --bind 127.0.0.1 --save "" --appendonly no >$work/r.log 2>&1 & rpid=$!
  until grep -qs "Ready to accept" $work/r.log; do sleep 0.05; done
  env -u KETCH_BIN $bin serve --listen 127.0.0.1:$kp --http-listen 127.0.0.1:$(fp) --redis-url redis://127.0.0.1:$rp >$work/k.log 2>&1 & kpid=$!
  until grep -qs "ketch serving" $work/k.log; do sleep 0.05; done
  $B producer --bootstrap-server 127.0.0.1:$kp --workload $w --topic t --records $n --create-topic --acks all --compression none --output json --quiet > $work/run.json
  python3 -c "import json,sys; d=json.load(open('$work/run.json')); t=d['results']['throughput']; print('%s %s %d %.3f %.3f' % ('$(basename $B)', '$w', t['records_per_s'], t['seconds'], d['duration_s']))"
  kill $kpid $rpid; wait $kpid $rpid 2>/dev/null; rm -rf $work
}
for r in $(seq $rounds); do
  for spec in "1-topic-1-partition-1kb 300000" "1-topic-16-partitions-1kb 300000" "1-topic-16-partitions-100b 1000000"; do
    set -- $spec
    if (( r % 2 )); then one /var/tmp/bench-final $1 $2; one /var/tmp/bench-exact $1 $2; else one /var/tmp/bench-exact $1 $2; one /var/tmp/bench-final $1 $2; fi
  done
done

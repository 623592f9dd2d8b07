#!/usr/bin/env bash
# Produce and consume through two ketch builds, alternated, for a
# before/after of the data path measured in one run on one machine:
#
#   benchmark/consume-compare.sh BEFORE_BIN AFTER_BIN [ROUNDS]
#
# For each workload and round, and each build in turn: a fresh redis-server,
# produce the workload through the build (acks=all), restart the build,
# consume everything from the beginning, and print a line with produce and
# consume rec/s, server CPU (ketch + redis-server, user + system) per
# record on each path, the consuming gateway's peak RSS (VmHWM) and the bytes
# Redis sent (total_net_output_bytes, produce and consume) and the XRANGE
# calls it served (reads: the produce phase makes none). Knobs
# (environment): WORKLOADS (default "1-topic-16-partitions-1kb:500000
# 1-topic-16-partitions-100b:2000000").
#
# MODE=latency measures fixed-rate latency instead: for each producer
# linger.ms in LINGERS (default "0 1") and round, each build on a fresh
# Redis, 10,000 records/s of 1 KiB to 16 partitions for LATENCY_DURATION
# (20s) through `ketch-bench roundtrip`; a line per run with produce
# (send to ack) and end-to-end (send to consume) p50 and p99, and the
# server CPU per record, the client's own CPU seconds and the gateway's
# context switches per record (voluntary and involuntary, all its threads,
# since it started).
#
# AFTER_UNIX=1 has the after side reach Redis through its Unix socket
# (redis.url = unix:///…), the before side over loopback TCP: pass the same
# ketch binary twice to measure the transport alone.
#
# BENCH_BEFORE and BENCH_AFTER (optional) give each side its own
# ketch-bench binary, to compare two builds of the client against one
# server (pass the same ketch binary twice).
set -euo pipefail

before=${1:?usage: consume-compare.sh BEFORE_BIN AFTER_BIN [ROUNDS]}
after=${2:?usage: consume-compare.sh BEFORE_BIN AFTER_BIN [ROUNDS]}
rounds=${3:-3}
workloads=${WORKLOADS:-"1-topic-16-partitions-1kb:500000 1-topic-16-partitions-100b:2000000"}
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p ketch-bench >&2
BENCH="$target/release/ketch-bench"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

work=$(mktemp -d)
cleanup() {
    [ -n "${ketch_pid:-}" ] && kill "$ketch_pid" 2>/dev/null && wait "$ketch_pid" 2>/dev/null
    [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

start_redis() {
    redis_port=$(free_port)
    rm -f "$work/redis.sock"
    redis-server --port "$redis_port" --bind 127.0.0.1 --unixsocket "$work/redis.sock" --unixsocketperm 700 \
        --save "" --appendonly no >"$work/redis.log" 2>&1 &
    redis_pid=$!
    until grep -q "Ready to accept connections" "$work/redis.log"; do
        kill -0 "$redis_pid"
        sleep 0.05
    done
}

stop() { # pid variable name
    local pid=${!1}
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    printf -v "$1" '%s' ""
}

start_ketch() {
    kafka_port=$(free_port)
    local url="redis://127.0.0.1:$redis_port"
    [ -n "${AFTER_UNIX:-}" ] && [ "${side:-}" = after ] && url="unix://$work/redis.sock"
    "$1" serve --listen "127.0.0.1:$kafka_port" --http-listen "127.0.0.1:$(free_port)" \
        --redis-url "$url" >"$work/ketch.log" 2>&1 &
    ketch_pid=$!
    until grep -qs "ketch serving" "$work/ketch.log"; do
        kill -0 "$ketch_pid" || { cat "$work/ketch.log" >&2; exit 1; }
        sleep 0.05
    done
}

# A fresh Redis and the build of $side (before or after) on it, and the
# client that side runs with.
start_side() {
    bin=$before
    client=${BENCH_BEFORE:-$BENCH}
    if [ "$side" = after ]; then
        bin=$after
        client=${BENCH_AFTER:-$BENCH}
    fi
    start_redis
    start_ketch "$bin"
}

rate() { python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['results']['throughput']['records_per_s']))" "$1"; }
cpu() { python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['server']['cpu_us_per_record'])" "$1"; }

if [ "${MODE:-}" = latency ]; then
    field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
    printf 'linger_ms\tround\tbuild\tproduce_p50_ms\tproduce_p99_ms\te2e_p50_ms\te2e_p99_ms\tserver_cpu_us_rec\tclient_cpu_s\tketch_switches_rec\n'
    for linger in ${LINGERS:-0 1}; do
        for round in $(seq 1 "$rounds"); do
            for side in before after; do
                start_side
                "$client" roundtrip --bootstrap-server "127.0.0.1:$kafka_port" --workload 1-topic-16-partitions-1kb \
                    --topic t --create-topic --rate 10000 --duration "${LATENCY_DURATION:-20s}" --linger-ms "$linger" \
                    --output json --quiet --server-pid "$ketch_pid" --server-pid "$redis_pid" >"$work/r.json"
                switches=$(cat /proc/"$ketch_pid"/task/*/status |
                    awk '/ctxt_switches/ {n += $2} END {print n}')
                stop ketch_pid
                stop redis_pid
                printf '%s\t%s\t%s\t%s\n' "$linger" "$round" "$side" "$(field "$work/r.json" \
                    "'\t'.join(str(x) for x in (r['results']['produce']['latency']['p50_ms'], r['results']['produce']['latency']['p99_ms'], r['results']['end_to_end_latency']['p50_ms'], r['results']['end_to_end_latency']['p99_ms'], r['server']['cpu_us_per_record'], r.get('client', {}).get('cpu_s', ''), round($switches / r['results']['produce']['latency']['count'], 3)))")"
            done
        done
    done
    exit 0
fi

printf 'workload\tround\tbuild\tproduce_rec_s\tconsume_rec_s\tproduce_cpu_us_rec\tconsume_cpu_us_rec\tconsume_peak_rss_kib\tredis_sent_bytes\txrange_calls\n'
for entry in $workloads; do
    workload=${entry%%:*}
    records=${entry##*:}
    for round in $(seq 1 "$rounds"); do
        for side in before after; do
            start_side
            "$client" producer --bootstrap-server "127.0.0.1:$kafka_port" --workload "$workload" --topic t \
                --create-topic --records "$records" --acks all --compression none --output json --quiet \
                --server-pid "$ketch_pid" --server-pid "$redis_pid" >"$work/p.json"
            stop ketch_pid
            start_ketch "$bin"
            "$client" consumer --bootstrap-server "127.0.0.1:$kafka_port" --workload "$workload" --topic t \
                --from beginning --records "$records" --output json --quiet \
                --server-pid "$ketch_pid" --server-pid "$redis_pid" >"$work/c.json"
            peak=$(awk '/VmHWM/ {print $2}' "/proc/$ketch_pid/status")
            sent=$(redis-cli -p "$redis_port" info stats | tr -d '\r' | awk -F: '/total_net_output_bytes/ {print $2}')
            xranges=$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' |
                sed -n 's/^cmdstat_xrange:calls=\([0-9]*\),.*/\1/p')
            stop ketch_pid
            stop redis_pid
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$workload" "$round" "$side" \
                "$(rate "$work/p.json")" "$(rate "$work/c.json")" "$(cpu "$work/p.json")" "$(cpu "$work/c.json")" \
                "$peak" "$sent" "${xranges:-0}"
        done
    done
done

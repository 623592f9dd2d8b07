#!/usr/bin/env bash
# ketch's performance baseline, in one run on one machine:
#
#   1. a fresh redis-server and a release `ketch` on free loopback ports;
#   2. the OpenMessaging-Benchmark preset matrix through ketch (produce, then
#      consume the same data), acks=all, no compression;
#   3. the direct-Redis baseline: the same number of same-size records written
#      straight into a Redis stream, one XADD per record, pipelined;
#   4. fixed-rate latency: 10,000 records/s of 1 KiB, produce and end-to-end,
#      with the producer's linger.ms at 0 and at 1;
#   5. compressed batches: 1 KiB text-like records to 16 partitions with lz4
#      and with zstd, produced and consumed. With COMPARE_KETCH_BIN (a build
#      before full validation), the compressed produce runs alternate between
#      that build and this one, COMPARE_ROUNDS times, on a fresh Redis each:
#      the cost of decompressing and checking every record on produce.
#
# Redis is flushed before each measurement, so its memory delta belongs to
# that measurement alone. Raw JSON results go to benchmark/results/<date>/,
# with summary.md (made by benchmark/summarize.py) beside them.
#
# Knobs (environment): RECORDS_1KB (default 500000), RECORDS_100B (2000000),
# LATENCY_DURATION (30s), OUT (results directory), BENCH_KETCH_BIN (a ketch binary
# to measure instead of this checkout's, e.g. an older build for a
# before/after comparison), COMPARE_KETCH_BIN and COMPARE_ROUNDS (2) for
# step 5, SKIP_PRESETS=1 (only steps 5; for iterating on it).
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS_1KB=${RECORDS_1KB:-500000}
RECORDS_100B=${RECORDS_100B:-2000000}
LATENCY_DURATION=${LATENCY_DURATION:-30s}
OUT=${OUT:-benchmark/results/$(date -u +%Y-%m-%d)}
target="${CARGO_TARGET_DIR:-target}"

log() { printf '\n==> %s\n' "$*" >&2; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

log "building release binaries"
cargo build --release -p ketch-gateway -p ketch-bench
KETCH="${BENCH_KETCH_BIN:-$target/release/ketch}"
BENCH="$target/release/ketch-bench"

mkdir -p "$OUT"
work=$(mktemp -d)
redis_port=$(free_port)
kafka_port=$(free_port)
http_port=$(free_port)
REDIS_URL="redis://127.0.0.1:$redis_port"
BOOTSTRAP="127.0.0.1:$kafka_port"

cleanup() {
    [ -n "${ketch_pid:-}" ] && kill "$ketch_pid" 2>/dev/null && wait "$ketch_pid" 2>/dev/null
    [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

log "starting redis-server on $redis_port"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
redis_pid=$!
until grep -q "Ready to accept connections" "$work/redis.log"; do
    kill -0 "$redis_pid" || { cat "$work/redis.log"; exit 1; }
    sleep 0.05
done

# Starts `ketch serve` from binary $1 (its log: $work/ketch.log).
start_ketch() {
    log "starting $1 on $kafka_port"
    "$1" serve --listen "$BOOTSTRAP" --http-listen "127.0.0.1:$http_port" --redis-url "$REDIS_URL" \
        >"$work/ketch.log" 2>&1 &
    ketch_pid=$!
    until grep -q "ketch serving" "$work/ketch.log"; do
        kill -0 "$ketch_pid" || { cat "$work/ketch.log"; exit 1; }
        sleep 0.05
    done
    common=(--output json --quiet --redis-info "$REDIS_URL" --server-pid "$ketch_pid" --server-pid "$redis_pid")
}

stop_ketch() {
    kill "$ketch_pid" && wait "$ketch_pid" 2>/dev/null || true
    ketch_pid=
}

start_ketch "$KETCH"

flush() { redis-cli -p "$redis_port" flushall >/dev/null; redis-cli -p "$redis_port" memory purge >/dev/null; }

run_id=$(date -u +%H%M%S)

records_for() {
    case "$1" in *100b*) echo "$RECORDS_100B" ;; *) echo "$RECORDS_1KB" ;; esac
}

presets=(1-topic-1-partition-1kb 1-topic-16-partitions-1kb 1-topic-16-partitions-100b
    1-topic-3-partitions-100b-3producers 1-topic-100-partitions-1kb)
[ -n "${SKIP_PRESETS:-}" ] && presets=()
for workload in "${presets[@]}"; do
    records=$(records_for "$workload")
    topic="bench-$workload-$run_id"
    flush
    log "$workload: produce $records records (acks=all, no compression)"
    "$BENCH" producer --bootstrap-server "$BOOTSTRAP" --workload "$workload" --topic "$topic" \
        --create-topic --records "$records" --acks all --compression none "${common[@]}" \
        --result-file "$OUT/produce-$workload.json" >/dev/null
    log "$workload: consume them"
    "$BENCH" consumer --bootstrap-server "$BOOTSTRAP" --workload "$workload" --topic "$topic" \
        --from beginning --records "$records" --validate checksum "${common[@]}" \
        --result-file "$OUT/consume-$workload.json" >/dev/null
done

for size in 1KB 100B; do
    [ -n "${SKIP_PRESETS:-}" ] && break
    case "$size" in 1KB) records=$RECORDS_1KB ;; *) records=$RECORDS_100B ;; esac
    for clients in 1 4; do
        flush
        log "direct Redis: $records XADDs of $size, pipelined 1000 deep, $clients connection(s)"
        "$BENCH" redis-xadd --redis-url "$REDIS_URL" --records "$records" --record-size "$size" \
            --clients "$clients" --pipeline 1000 --delete-first --output json --quiet \
            --redis-info "$REDIS_URL" --server-pid "$redis_pid" \
            --result-file "$OUT/xadd-$size-$clients.json" >/dev/null
    done
done

for linger in 0 1; do
    [ -n "${SKIP_PRESETS:-}" ] && break
    flush
    log "fixed rate: 10,000 records/s of 1 KiB for $LATENCY_DURATION, linger.ms=$linger"
    "$BENCH" roundtrip --bootstrap-server "$BOOTSTRAP" --workload 1-topic-16-partitions-1kb \
        --topic "bench-latency-$linger-$run_id" --create-topic --rate 10000 --duration "$LATENCY_DURATION" \
        --linger-ms "$linger" "${common[@]}" --result-file "$OUT/roundtrip-10k-1kb-linger$linger.json" >/dev/null
done

# 5. Compressed batches: every record is decompressed and checked on produce.
compressed() { # codec, binary label, result prefix; sets $topic
    local codec=$1 label=$2 prefix=$3
    topic="bench-$codec-$label-$run_id-$RANDOM"
    flush
    log "compressed ($label): produce $RECORDS_1KB records of 1 KiB text with $codec"
    "$BENCH" producer --bootstrap-server "$BOOTSTRAP" --workload 1-topic-16-partitions-1kb \
        --topic "$topic" --create-topic --records "$RECORDS_1KB" --acks all \
        --compression "$codec" --payload text "${common[@]}" \
        --result-file "$OUT/$prefix-$codec.json" >/dev/null
}
for codec in lz4 zstd; do
    compressed "$codec" this produce-compressed
    log "compressed: consume them"
    "$BENCH" consumer --bootstrap-server "$BOOTSTRAP" --workload 1-topic-16-partitions-1kb \
        --topic "$topic" --from beginning \
        --records "$RECORDS_1KB" --validate checksum "${common[@]}" \
        --result-file "$OUT/consume-compressed-$codec.json" >/dev/null
done
if [ -n "${COMPARE_KETCH_BIN:-}" ]; then
    for round in $(seq 1 "${COMPARE_ROUNDS:-2}"); do
        for side in compare this; do
            stop_ketch
            if [ "$side" = compare ]; then start_ketch "$COMPARE_KETCH_BIN"; else start_ketch "$KETCH"; fi
            for codec in lz4 zstd; do
                compressed "$codec" "$side" "validation-$side-$round"
            done
        done
    done
fi

{
    echo "host: $(uname -srm), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "redis: $(redis-server --version)"
    echo "ketch: $("$KETCH" --version) (${BENCH_KETCH_BIN:+$BENCH_KETCH_BIN, }checkout $(git rev-parse --short HEAD))"
    echo "rustc: $(rustc --version)"
    echo "command: RECORDS_1KB=$RECORDS_1KB RECORDS_100B=$RECORDS_100B LATENCY_DURATION=$LATENCY_DURATION${COMPARE_KETCH_BIN:+ COMPARE_KETCH_BIN=$COMPARE_KETCH_BIN COMPARE_ROUNDS=${COMPARE_ROUNDS:-2}}${SKIP_PRESETS:+ SKIP_PRESETS=1} benchmark/run-baseline.sh"
} >"$OUT/environment.txt"

python3 benchmark/summarize.py "$OUT" >"$OUT/summary.md"
cat "$OUT/summary.md"

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
#   6. Redis Cluster: 1 KiB records to 24 partitions (acks=all, spread evenly:
#      no sticky partitioning), produced and consumed through a ketch in
#      cluster mode on a 3-master cluster, and the same through the
#      single-Redis ketch, in one run; each master's share
#      of the Redis CPU and the ketch + Redis CPU per record of both
#      (cluster.md beside summary.md).
#
# A peer (any Kafka-compatible broker) is measured in the same run with the
# same presets and fixed-rate latency, alternated with ketch (odd presets
# ketch first, even presets the peer first), so a reader sees ketch, the
# peer and the direct-XADD baseline side by side (summary.md):
#
#   benchmark/run-baseline.sh --peer-bootstrap HOST:PORT [--peer-pid PID] [--peer-name NAME]
#   benchmark/run-baseline.sh --peer-cmd 'BROKER ARGS… {port} …' [--peer-name NAME]
#
# --peer-bootstrap names a broker already running (--peer-pid gives its
# process for CPU and peak RSS); --peer-cmd starts one, `{port}` replaced by
# a free port, and stops it at the end. benchmark/README.md shows both for
# nisshi, Apache Kafka and Redpanda.
#
# Redis is flushed before each measurement, so its memory delta belongs to
# that measurement alone. Raw JSON results go to benchmark/results/<date>/,
# with summary.md (made by benchmark/summarize.py) beside them.
#
# Knobs (environment): RECORDS_1KB (default 500000), RECORDS_100B (2000000),
# LATENCY_DURATION (30s), OUT (results directory), BENCH_KETCH_BIN (a ketch binary
# to measure instead of this checkout's, e.g. an older build for a
# before/after comparison), COMPARE_KETCH_BIN and COMPARE_ROUNDS (2) for
# step 5, SKIP_PRESETS=1 (only steps 5 and 6; for iterating on them),
# SKIP_COMPRESSED=1 (no step 5), SKIP_CLUSTER=1 (no step 6), CLUSTER_MASTERS (3; 1
# or at least 3), PEER_ROUNDS (1; with a peer, the presets run that many times,
# alternated, and summary.md gives every round's ratios and their median; a
# peer from --peer-cmd is started afresh for each round),
# CLUSTER_PARTITIONS (24).
set -euo pipefail
cd "$(dirname "$0")/.."

PEER_BOOTSTRAP= PEER_PID= PEER_CMD= PEER_NAME=peer
while [ $# -gt 0 ]; do
    case "$1" in
        --peer-bootstrap) PEER_BOOTSTRAP=${2:?--peer-bootstrap HOST:PORT}; shift 2 ;;
        --peer-pid) PEER_PID=${2:?--peer-pid PID}; shift 2 ;;
        --peer-cmd) PEER_CMD=${2:?--peer-cmd 'COMMAND with {port}'}; shift 2 ;;
        --peer-name) PEER_NAME=${2:?--peer-name NAME}; shift 2 ;;
        *) echo "run-baseline.sh: unknown argument $1 (--peer-bootstrap, --peer-pid, --peer-cmd, --peer-name)" >&2; exit 2 ;;
    esac
done
if [ -n "$PEER_CMD" ] && [ -n "$PEER_BOOTSTRAP" ]; then
    echo "run-baseline.sh: give --peer-cmd or --peer-bootstrap, not both" >&2
    exit 2
fi

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
cluster_pids=()
redis_port=$(free_port)
kafka_port=$(free_port)
http_port=$(free_port)
REDIS_URL="redis://127.0.0.1:$redis_port"
BOOTSTRAP="127.0.0.1:$kafka_port"

cleanup() {
    [ -n "${ketch_pid:-}" ] && kill "$ketch_pid" 2>/dev/null && wait "$ketch_pid" 2>/dev/null
    [ -n "${cluster_ketch_pid:-}" ] && kill "$cluster_ketch_pid" 2>/dev/null && wait "$cluster_ketch_pid" 2>/dev/null
    for pid in "${cluster_pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
    [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    [ -n "$PEER_CMD" ] && [ -n "${PEER_PID:-}" ] && kill "$PEER_PID" 2>/dev/null && wait "$PEER_PID" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# Starts the peer from --peer-cmd on a free port (its log: $work/peer.log).
start_peer() {
    peer_port=$(free_port)
    PEER_BOOTSTRAP="127.0.0.1:$peer_port"
    log "starting the peer ($PEER_NAME) on $peer_port: ${PEER_CMD//\{port\}/$peer_port}"
    bash -c "exec ${PEER_CMD//\{port\}/$peer_port}" >"$work/peer.log" 2>&1 &
    PEER_PID=$!
    until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $peer_port), 1)" 2>/dev/null; do
        kill -0 "$PEER_PID" || { cat "$work/peer.log"; exit 1; }
        sleep 0.1
    done
    peer_common=(--output json --quiet --server-pid "$PEER_PID")
}
peer_common=(--output json --quiet)
[ -n "$PEER_PID" ] && peer_common+=(--server-pid "$PEER_PID")
[ -n "$PEER_CMD" ] && start_peer

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
# One preset through ketch (`ketch`) or the peer (`peer`): produce, then
# consume what was produced.
preset() { # side, workload
    local side=$1 workload=$2 records bootstrap prefix args
    records=$(records_for "$workload")
    if [ "$side" = ketch ]; then
        flush
        bootstrap=$BOOTSTRAP prefix= args=("${common[@]}")
    else
        bootstrap=$PEER_BOOTSTRAP prefix=peer- args=("${peer_common[@]}")
    fi
    local topic="bench-$workload-$run_id${suffix:-}"
    log "$workload ($side): produce $records records (acks=all, no compression)"
    "$BENCH" producer --bootstrap-server "$bootstrap" --workload "$workload" --topic "$topic" \
        --create-topic --records "$records" --acks all --compression none "${args[@]}" \
        --result-file "$OUT/${prefix}produce-$workload${suffix:-}.json" >/dev/null
    log "$workload ($side): consume them"
    "$BENCH" consumer --bootstrap-server "$bootstrap" --workload "$workload" --topic "$topic" \
        --from beginning --records "$records" --validate checksum "${args[@]}" \
        --result-file "$OUT/${prefix}consume-$workload${suffix:-}.json" >/dev/null
}
# With a peer, PEER_ROUNDS rounds of the presets (each round's results
# beside the first's, named …-round<N>.json); who goes first alternates
# by preset and by round.
rounds=1
[ -n "$PEER_BOOTSTRAP" ] && rounds=${PEER_ROUNDS:-1}
for round in $(seq 1 "$rounds"); do
    suffix=
    [ "$round" -gt 1 ] && suffix="-round$round"
    # A peer started here starts each round afresh, as ketch's Redis is
    # flushed for each preset: a broker that keeps every record in memory
    # slows as it grows, and later rounds would measure that.
    if [ "$round" -gt 1 ] && [ -n "$PEER_CMD" ]; then
        kill "$PEER_PID" && wait "$PEER_PID" 2>/dev/null || true
        start_peer
    fi
    index=$round
    for workload in "${presets[@]}"; do
        index=$((index + 1))
        if [ -z "$PEER_BOOTSTRAP" ]; then
            preset ketch "$workload"
        elif (( index % 2 )); then
            preset peer "$workload"
            preset ketch "$workload"
        else
            preset ketch "$workload"
            preset peer "$workload"
        fi
    done
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
    [ -z "$PEER_BOOTSTRAP" ] && continue
    log "fixed rate through the peer ($PEER_NAME), linger.ms=$linger"
    "$BENCH" roundtrip --bootstrap-server "$PEER_BOOTSTRAP" --workload 1-topic-16-partitions-1kb \
        --topic "bench-latency-$linger-$run_id" --create-topic --rate 10000 --duration "$LATENCY_DURATION" \
        --linger-ms "$linger" "${peer_common[@]}" --result-file "$OUT/peer-roundtrip-10k-1kb-linger$linger.json" >/dev/null
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
    [ -n "${SKIP_COMPRESSED:-}" ] && break
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

# 6. Redis Cluster beside single Redis. One measurement: produce, then
# consume, through the single-Redis ketch or the cluster one (cluster_step's
# variables: ports, pids, server_pids, cluster_kafka_port, partitions).
cluster_run() {
    local mode=$1 round=$2
    local bootstrap=$BOOTSTRAP pid_args=("${common[@]}")
    if [ "$mode" = cluster ]; then
        bootstrap="127.0.0.1:$cluster_kafka_port"
        pid_args=(--output json --quiet "${server_pids[@]}")
    fi
    local topic="bench-$mode-${partitions}p-$run_id-$round"
    local name="$mode-${partitions}p-1kb-$round"
    if [ "$mode" = cluster ]; then
        for port in "${ports[@]}"; do redis-cli -p "$port" config resetstat >/dev/null; done
    else
        flush
    fi
    log "$mode (round $round): produce $RECORDS_1KB records of 1 KiB to $partitions partitions (acks=all)"
    "$BENCH" producer --bootstrap-server "$bootstrap" --workload 1-topic-16-partitions-1kb \
        --partitions "$partitions" --topic "$topic" --create-topic --records "$RECORDS_1KB" --acks all \
        --compression none --command-config "$work/even.properties" "${pid_args[@]}" \
        --result-file "$OUT/produce-$name.json" >/dev/null
    if [ "$mode" = cluster ]; then
        # What each master took in and holds: how even the load was.
        printf 'port\tpid\tnet_input_bytes\tkeys\n' >"$OUT/cluster-masters-$round.tsv"
        for i in "${!ports[@]}"; do
            printf '%s\t%s\t%s\t%s\n' "${ports[$i]}" "${pids[$i]}" \
                "$(redis-cli -p "${ports[$i]}" info stats | tr -d '\r' | awk -F: '/total_net_input_bytes/ {print $2}')" \
                "$(redis-cli -p "${ports[$i]}" dbsize)" >>"$OUT/cluster-masters-$round.tsv"
        done
    fi
    log "$mode (round $round): consume them"
    "$BENCH" consumer --bootstrap-server "$bootstrap" --workload 1-topic-16-partitions-1kb \
        --topic "$topic" --from beginning --records "$RECORDS_1KB" --validate checksum \
        "${pid_args[@]}" --result-file "$OUT/consume-$name.json" >/dev/null
    if [ "$mode" = cluster ]; then
        "$KETCH" placement --redis-url "$seeds" --set redis.mode=cluster >"$OUT/cluster-placement-$round.tsv"
        # Its data goes before the other mode runs (ketch makes its
        # registry keys again as it needs them).
        for port in "${ports[@]}"; do redis-cli -p "$port" flushall >/dev/null; done
    else
        flush
    fi
}

cluster_step() {
    local masters=${CLUSTER_MASTERS:-3} partitions=${CLUSTER_PARTITIONS:-24}
    local ports=() pids=() addresses=()
    for i in $(seq 1 "$masters"); do
        local port bus dir
        port=$(free_port)
        bus=$(free_port)
        dir="$work/cluster-$i"
        mkdir -p "$dir"
        redis-server --port "$port" --cluster-port "$bus" --bind 127.0.0.1 --save "" --appendonly no \
            --cluster-enabled yes --cluster-node-timeout 5000 --dir "$dir" >"$dir/log" 2>&1 &
        pids+=($!)
        ports+=("$port")
        addresses+=("127.0.0.1:$port")
        until grep -q "Ready to accept connections" "$dir/log"; do sleep 0.05; done
    done
    cluster_pids=("${pids[@]}")
    if [ "$masters" -eq 1 ]; then
        # redis-cli --cluster create wants 3 masters; one takes every slot.
        redis-cli -p "${ports[0]}" cluster addslotsrange 0 16383 >"$work/cluster-create.log"
    else
        redis-cli --cluster create "${addresses[@]}" --cluster-replicas 0 --cluster-yes >"$work/cluster-create.log"
    fi
    for port in "${ports[@]}"; do
        until redis-cli -p "$port" cluster info | grep -q "cluster_state:ok"; do sleep 0.1; done
    done
    seeds=$(printf 'redis://%s,' "${addresses[@]}")
    seeds=${seeds%,}
    local cluster_kafka_port cluster_http_port
    cluster_kafka_port=$(free_port)
    cluster_http_port=$(free_port)
    log "starting $KETCH in cluster mode on $cluster_kafka_port ($masters masters)"
    "$KETCH" serve --listen "127.0.0.1:$cluster_kafka_port" --http-listen "127.0.0.1:$cluster_http_port" \
        --redis-url "$seeds" --set redis.mode=cluster >"$work/ketch-cluster.log" 2>&1 &
    cluster_ketch_pid=$!
    until grep -q "ketch serving" "$work/ketch-cluster.log"; do
        kill -0 "$cluster_ketch_pid" || { cat "$work/ketch-cluster.log"; exit 1; }
        sleep 0.05
    done
    local server_pids=(--server-pid "$cluster_ketch_pid")
    for pid in "${pids[@]}"; do server_pids+=(--server-pid "$pid"); done
    # Records spread evenly over the partitions (no sticky partitioning),
    # so each master's share measures placement, not the partitioner's luck.
    printf 'sticky.partitioning.linger.ms=0\n' >"$work/even.properties"
    # Whichever mode runs second in a pair measured up to a third slower
    # here, so the order alternates by round, and each mode's data is
    # deleted before the other runs.
    local rounds=${CLUSTER_ROUNDS:-2} round order
    for round in $(seq 1 "$rounds"); do
        order="single cluster"
        [ $((round % 2)) -eq 0 ] && order="cluster single"
        for mode in $order; do
            cluster_run "$mode" "$round"
        done
    done
    kill "$cluster_ketch_pid" && wait "$cluster_ketch_pid" 2>/dev/null || true
    cluster_ketch_pid=
    python3 benchmark/summarize.py --cluster "$OUT" "$partitions" "$rounds" >"$OUT/cluster.md"
    cat "$OUT/cluster.md"
}
if [ -z "${SKIP_CLUSTER:-}" ]; then
    cluster_step
fi

{
    echo "host: $(uname -srm), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "redis: $(redis-server --version)"
    echo "ketch: $("$KETCH" --version) (${BENCH_KETCH_BIN:+$BENCH_KETCH_BIN, }checkout $(git rev-parse --short HEAD))"
    echo "rustc: $(rustc --version)"
    [ -n "$PEER_BOOTSTRAP" ] && echo "peer: $PEER_NAME at $PEER_BOOTSTRAP${PEER_PID:+ (pid $PEER_PID)}${PEER_CMD:+, started as: $PEER_CMD}"
    echo "command: RECORDS_1KB=$RECORDS_1KB RECORDS_100B=$RECORDS_100B LATENCY_DURATION=$LATENCY_DURATION${COMPARE_KETCH_BIN:+ COMPARE_KETCH_BIN=$COMPARE_KETCH_BIN COMPARE_ROUNDS=${COMPARE_ROUNDS:-2}}${SKIP_PRESETS:+ SKIP_PRESETS=1}${SKIP_COMPRESSED:+ SKIP_COMPRESSED=1}${SKIP_CLUSTER:+ SKIP_CLUSTER=1} benchmark/run-baseline.sh${PEER_BOOTSTRAP:+ (with the peer above)}"
} >"$OUT/environment.txt"

python3 benchmark/summarize.py "$OUT" >"$OUT/summary.md"
cat "$OUT/summary.md"

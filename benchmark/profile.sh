#!/usr/bin/env bash
# Where one path's CPU goes, ketch and Redis apart:
#
#   benchmark/profile.sh KETCH_BIN WORKLOAD RECORDS [produce|consume]
#
# A fresh redis-server and KETCH_BIN on free loopback ports; a warm-up
# produce of 20,000 records to another topic; then RECORDS records of
# WORKLOAD (a ketch-bench preset) produced (acks=all, no compression) or,
# for `consume`, produced and then consumed from the beginning. For the
# measured phase it prints the rate, the CPU of ketch and of Redis apart
# (user + system from /proc, µs per record: the whole phase, so client
# start-up counts too) and Redis's slowest commands by total time
# (INFO commandstats, reset before the phase: time inside EXEC or a script
# counts both there and under the commands it ran).
#
# PERF=1 also samples both processes (perf record, 5 kHz; ketch with DWARF
# call graphs) during the phase into OUT (default: a new directory under
# /tmp), named ketch.perf and redis.perf, for `perf report -i`.
# REDIS_UNIX=1 has ketch reach Redis through its Unix socket
# (redis.url = unix:///…) instead of loopback TCP.
# REDIS_PERF_ARGS adds arguments to Redis's perf record (e.g. `-g`: the
# kernel's call chains show which copy a page fault came from), REDIS_ARGS
# to its redis-server command line, and the environment reaches
# redis-server too (its jemalloc reads MALLOC_CONF).
set -euo pipefail

bin=${1:?usage: profile.sh KETCH_BIN WORKLOAD RECORDS [produce|consume]}
workload=${2:?workload}
records=${3:?records}
path=${4:-produce}
target="${CARGO_TARGET_DIR:-target}"
BENCH="$target/release/ketch-bench"
[ -x "$BENCH" ] || cargo build --release -p ketch-bench >&2

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
work=$(mktemp -d)
cleanup() {
    kill ${perf_pids:-} 2>/dev/null || true
    kill ${ketch_pid:-} ${redis_pid:-} 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --unixsocket "$work/redis.sock" --unixsocketperm 700 \
    --save "" --appendonly no ${REDIS_ARGS:-} >"$work/redis.log" 2>&1 &
redis_pid=$!
until grep -qs "Ready to accept connections" "$work/redis.log"; do kill -0 "$redis_pid"; sleep 0.05; done
kafka_port=$(free_port)
redis_url="redis://127.0.0.1:$redis_port"
[ -n "${REDIS_UNIX:-}" ] && redis_url="unix://$work/redis.sock"
"$bin" serve --listen "127.0.0.1:$kafka_port" --http-listen "127.0.0.1:$(free_port)" \
    --redis-url "$redis_url" >"$work/ketch.log" 2>&1 &
ketch_pid=$!
until grep -qs "ketch serving" "$work/ketch.log"; do kill -0 "$ketch_pid" || { cat "$work/ketch.log" >&2; exit 1; }; sleep 0.05; done

bench() { # producer|consumer TOPIC RECORDS [args…]
    local role=$1 topic=$2 n=$3
    shift 3
    "$BENCH" "$role" --bootstrap-server "127.0.0.1:$kafka_port" --workload "$workload" --topic "$topic" \
        --records "$n" --output json --quiet "$@"
}
produce() { bench producer "$1" "$2" --create-topic --acks all --compression none; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

produce warm 20000 >/dev/null
[ "$path" = consume ] && produce t "$records" >/dev/null
redis-cli -p "$redis_port" config resetstat >/dev/null
if [ -n "${PERF:-}" ]; then
    out=${OUT:-$(mktemp -d /tmp/ketch-profile.XXXX)}
    mkdir -p "$out"
    perf record -F 5000 --call-graph dwarf,16384 -o "$out/ketch.perf" -p "$ketch_pid" >/dev/null 2>&1 &
    perf_pids="$!"
    perf record -F 5000 ${REDIS_PERF_ARGS:-} -o "$out/redis.perf" -p "$redis_pid" >/dev/null 2>&1 &
    perf_pids="$perf_pids $!"
    sleep 0.5
fi
k0=$(ticks "$ketch_pid") r0=$(ticks "$redis_pid")
if [ "$path" = consume ]; then
    bench consumer t "$records" --from beginning >"$work/run.json"
else
    produce t "$records" >"$work/run.json"
fi
k1=$(ticks "$ketch_pid") r1=$(ticks "$redis_pid")
if [ -n "${PERF:-}" ]; then
    kill -INT $perf_pids
    wait $perf_pids || true
    perf_pids=
    echo "profiles: $out/ketch.perf $out/redis.perf"
fi
hz=$(getconf CLK_TCK)
python3 - "$work/run.json" "$records" "$hz" "$k0" "$k1" "$r0" "$r1" "$path" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
n, hz = int(sys.argv[2]), int(sys.argv[3])
k0, k1, r0, r1 = map(int, sys.argv[4:8])
print("%s %d rec/s  ketch %.3f µs/record  redis %.3f µs/record" % (
    sys.argv[8], run["results"]["throughput"]["records_per_s"],
    (k1 - k0) * 1e6 / hz / n, (r1 - r0) * 1e6 / hz / n))
EOF
redis-cli -p "$redis_port" info commandstats | tr -d '\r' | grep '^cmdstat_' |
    sort -t= -k3 -rn | head -8 || true

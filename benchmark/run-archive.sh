#!/usr/bin/env bash
# The archive benchmark (issue #5), in one run on one machine:
#
#   1. a fresh redis-server, a local S3 server (ketch-s3, s3s-fs over a
#      temporary directory) and a release `ketch` whose warehouse is that S3
#      server (SQLite catalog in the work directory);
#   2. archive throughput: RECORDS records of 100 B are produced to a
#      remote-storage topic of 1 partition (then of 4) through a gateway whose
#      catalog is unreachable, so segments are sealed (segment.bytes) but none
#      archived; a gateway with the real catalog is then started and timed
#      from its start until /metrics shows every record archived;
#   3. consume throughput of the same data from each tier: the same records
#      in a topic kept in Redis and in the archived topic, trimmed from Redis
#      (local.retention.bytes=0), read from offset 0 by ketch-bench
#      consumer, alternately, twice each.
#
# Knobs (environment): RECORDS (default 2000000), SEGMENT_BYTES (64 MiB),
# PAYLOAD (random, the default, text or zeros: ketch-bench producer --payload),
# OUT (results directory, default benchmark/results/<date>/archive),
# BENCH_KETCH_BIN (another gateway binary to measure), BENCH_S3_BIN (another
# build of the S3 server),
# KETCH_TIERING_COMPRESSION / KETCH_TIERING_COMPRESSION_LEVEL (the archive's
# codec, as every gateway setting, from the environment: zstd, lz4, snappy…),
# PROFILE=1 (perf profiles of ketch while it archives and while it serves each
# tier, profile-*.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS=${RECORDS:-2000000}
SEGMENT_BYTES=${SEGMENT_BYTES:-67108864}
OUT=${OUT:-benchmark/results/$(date -u +%Y-%m-%d)/archive}
target="${CARGO_TARGET_DIR:-target}"

log() { printf '\n==> %s\n' "$*" >&2; }
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_for() { # file marker pid
    until grep -q "$2" "$1"; do
        kill -0 "$3" 2>/dev/null || { cat "$1"; exit 1; }
        sleep 0.05
    done
}

log "building release binaries"
cargo build --release -p ketch-gateway -p ketch-bench
KETCH="${BENCH_KETCH_BIN:-$target/release/ketch}"
BENCH="$target/release/ketch-bench"
S3="${BENCH_S3_BIN:-$target/release/ketch-s3}"

mkdir -p "$OUT"
work=$(mktemp -d)
redis_port=$(free_port)
s3_port=$(free_port)
kafka_port=$(free_port)
http_port=$(free_port)
REDIS_URL="redis://127.0.0.1:$redis_port"
BOOTSTRAP="127.0.0.1:$kafka_port"

cleanup() {
    [ -n "${ketch_pid:-}" ] && kill "$ketch_pid" 2>/dev/null && wait "$ketch_pid" 2>/dev/null &&
        cat "$work/ketch.log" >>"$OUT/ketch.log"
    [ -n "${s3_pid:-}" ] && kill "$s3_pid" 2>/dev/null && wait "$s3_pid" 2>/dev/null
    [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
redis_pid=$!
wait_for "$work/redis.log" "Ready to accept connections" "$redis_pid"
"$S3" --root "$work/s3" --bucket lake --listen "127.0.0.1:$s3_port" \
    --access-key bench --secret-key bench-secret >"$work/s3.log" 2>&1 &
s3_pid=$!
wait_for "$work/s3.log" "listening on" "$s3_pid"

# start_ketch CATALOG_URI: a gateway on the S3 warehouse (empty URI: the
# SQLite catalog in the work directory).
start_ketch() {
    "$KETCH" serve --listen "$BOOTSTRAP" --http-listen "127.0.0.1:$http_port" --redis-url "$REDIS_URL" \
        --set "tiering.tick_interval=200ms" --set "tiering.lease_ttl=2s" --set "tiering.catalog_uri=$1" \
        --set "tiering.data_dir=$work/data" --set "tiering.warehouse=s3://lake/warehouse" \
        --set "tiering.s3_endpoint=http://127.0.0.1:$s3_port" --set tiering.s3_access_key_id=bench \
        --set tiering.s3_secret_access_key=bench-secret --set tiering.s3_path_style=true \
        --set "log.level=${KETCH_LOG_LEVEL:-info,ketch_tiering::archive=debug}" \
        >"$work/ketch.log" 2>&1 &
    ketch_pid=$!
    wait_for "$work/ketch.log" "ketch serving" "$ketch_pid"
}
# Every gateway's log is kept, one after another, in $OUT/ketch.log.
stop_ketch() {
    kill "$ketch_pid" && wait "$ketch_pid" || true
    cat "$work/ketch.log" >>"$OUT/ketch.log"
    ketch_pid=
}
# cpu_ticks PID: the process's user + system CPU time so far, in clock ticks.
cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat"
}
metric() {
    curl -s "http://127.0.0.1:$http_port/metrics" | awk -v m="$1" '$1 == m {print $2}'
}
create_topic() { # name partitions remote local_retention_bytes
    python3 - "$BOOTSTRAP" "$@" <<'PY'
import os, sys
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, name, partitions, remote, local_bytes = sys.argv[1:]
configs = {"retention.ms": "-1", "segment.ms": "2000", "segment.bytes": os.environ["SEGMENT_BYTES"]}
if remote == "true":
    configs.update({"remote.storage.enable": "true", "local.retention.bytes": local_bytes})
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic(name, int(partitions), 1, config=configs)]).values():
    f.result()
PY
}
export SEGMENT_BYTES
produce() { # topic partitions
    "$BENCH" producer --bootstrap-server "$BOOTSTRAP" --topic "$1" --partitions "$2" --record-size 100 \
        --records "$RECORDS" --acks 1 --compression none --payload "${PAYLOAD:-random}" --output json --quiet \
        --result-file "$OUT/produce-$1.json" >/dev/null
}

results="$OUT/archive.jsonl"
: >"$results"
: >"$OUT/ketch.log"
unreachable="postgres://nobody@127.0.0.1:$(free_port)/none"
for partitions in 1 4; do
    log "$partitions partition(s): produce $RECORDS records of 100 B; segments sealed, not archived"
    start_ketch "$unreachable"
    create_topic "archive$partitions" "$partitions" true 0
    produce "archive$partitions" "$partitions"
    [ "$partitions" = 1 ] && create_topic redis1 1 false 0 && produce redis1 1
    sleep 3 # segment.ms=2000: the tail is sealed too
    stop_ketch
    log "$partitions partition(s): archive them"
    start=$(date +%s.%N)
    s3_cpu_before=$(cpu_ticks "$s3_pid")
    start_ketch ""
    if [ -n "${PROFILE:-}" ]; then
        perf record -e cpu-clock -F 999 -g -p "$ketch_pid" -o "$work/perf-archive.data" 2>/dev/null &
        perf_pid=$!
    fi
    until [ "$(metric ketch_archive_records_total)" = "$RECORDS" ]; do
        kill -0 "$ketch_pid" || { cat "$work/ketch.log"; exit 1; }
        sleep 0.05
    done
    end=$(date +%s.%N)
    ketch_cpu=$(cpu_ticks "$ketch_pid")
    s3_cpu=$(($(cpu_ticks "$s3_pid") - s3_cpu_before))
    if [ -n "${PROFILE:-}" ]; then
        kill -INT "$perf_pid" && wait "$perf_pid" || true
        perf report -i "$work/perf-archive.data" --no-children --percent-limit 1 --stdio 2>/dev/null \
            | grep -E '^ +[0-9]' >"$OUT/profile-archive-$partitions.txt" || true
    fi
    python3 - "$partitions" "$start" "$end" "$RECORDS" "$(metric ketch_archive_bytes_total)" \
        "$(metric ketch_archive_segments_total)" "$(metric ketch_archive_failures_total)" \
        "$(metric ketch_archive_segment_seconds_sum)" "$work/ketch.log" "$ketch_cpu" "$s3_cpu" \
        "$(getconf CLK_TCK)" >>"$results" <<'PY'
import datetime, json, re, sys
(partitions, start, end, records, parquet_bytes, segments, failures, archiving, log,
 ketch_cpu, s3_cpu, tick) = sys.argv[1:]
seconds = float(end) - float(start)
# archiving_s: the sum of the segments' times (read, write, commit); a
# partition's next segment is read while the one before commits, so this
# counts the overlap twice. archiving_wall_s: from the first segment's
# first read to the last commit, off the archiver's debug line per segment
# (its time, and committed_ms since that segment's first read). seconds
# also holds the gateway's start, the catalog's opening and the first ticks.
spans = []
for line in open(log, errors="replace"):
    m = re.match(r"(\S+Z) .*committed_ms=(\d+)", line)
    if m:
        at = datetime.datetime.fromisoformat(m[1].replace("Z", "+00:00")).timestamp()
        spans.append((at - int(m[2]) / 1000, at))
wall = max(e for _, e in spans) - min(s for s, _ in spans) if spans else None
print(json.dumps({"measure": "archive", "partitions": int(partitions), "records": int(records),
                  "seconds": round(seconds, 3), "records_per_s": round(int(records) / seconds),
                  "archiving_wall_s": round(wall, 3) if wall else None,
                  "records_per_archiving_wall_s": round(int(records) / wall) if wall else None,
                  # (absent from builds before the metric)
                  "archiving_s": round(float(archiving), 3) if archiving else None,
                  "records_per_archiving_s": round(int(records) / float(archiving)) if archiving else None,
                  # CPU seconds (user + system) of the archiving gateway from
                  # its start, and of the S3 server over the same time.
                  "ketch_cpu_s": round(int(ketch_cpu) / int(tick), 2),
                  "s3_server_cpu_s": round(int(s3_cpu) / int(tick), 2),
                  "parquet_bytes": int(float(parquet_bytes)), "segments": int(float(segments)),
                  "failures": int(float(failures))}))
PY
    tail -1 "$results"
    stop_ketch
done

log "consume the same data from Redis (redis1) and from the archive (archive1)"
start_ketch ""
for round in 1 2; do
    for topic in redis1 archive1; do
        if [ -n "${PROFILE:-}" ] && [ "$round" = 1 ]; then
            # PROFILE=1: sample ketch's CPU while it serves this topic.
            perf record -e cpu-clock -F 999 -g -p "$ketch_pid" -o "$work/perf-$topic.data" 2>/dev/null &
            perf_pid=$!
        fi
        /usr/bin/time -f "consumer cpu: user %U s, system %S s, wall %e s" -a -o "$OUT/consumer-cpu-$topic.txt" \
        "$BENCH" consumer --bootstrap-server "$BOOTSTRAP" --topic "$topic" --from beginning \
            --records "$RECORDS" --output json --quiet --server-pid "$ketch_pid" \
            --result-file "$OUT/consume-$topic-$round.json" >/dev/null
        if [ -n "${perf_pid:-}" ]; then
            kill -INT "$perf_pid"; wait "$perf_pid" || true; perf_pid=
            perf report -i "$work/perf-$topic.data" --no-children --percent-limit 1.5 --stdio 2>/dev/null \
                | grep -v '^$' | head -60 >"$OUT/profile-$topic.txt" || true
        fi
        python3 - "$OUT/consume-$topic-$round.json" "$topic" "$round" >>"$results" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["results"]["throughput"]
print(json.dumps({"measure": "consume", "topic": sys.argv[2], "round": int(sys.argv[3]),
                  "records": t["records"], "records_per_s": round(t["records_per_s"]),
                  "tier": "redis" if sys.argv[2].startswith("redis") else "archive"}))
PY
        tail -1 "$results"
    done
done
echo "remote reads: $(metric ketch_remote_read_bytes_total) bytes, cache hits $(metric ketch_remote_read_cache_hits_total), misses $(metric ketch_remote_read_cache_misses_total)" | tee "$OUT/remote-reads.txt"

{
    echo "host: $(uname -srm), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "redis: $(redis-server --version)"
    echo "ketch: $("$KETCH" --version) (checkout $(git rev-parse --short HEAD))"
    echo "command: RECORDS=$RECORDS SEGMENT_BYTES=$SEGMENT_BYTES PAYLOAD=${PAYLOAD:-random} benchmark/run-archive.sh"
    echo "archive codec: ${KETCH_TIERING_COMPRESSION:-zstd (default)} level ${KETCH_TIERING_COMPRESSION_LEVEL:-default}"
} >"$OUT/environment.txt"
cat "$results"

#!/usr/bin/env bash
# Redis's CPU filling a stream from empty, with and without transparent huge
# pages (benchmark/README.md, twenty-second round). Alternates a fresh
# redis-server per run: defaults (Redis disables THP for itself), then THP on
# (`--disable-thp no`, and jemalloc asked to use them: MALLOC_CONF=thp:always;
# the kernel's THP mode here is `madvise`). fill.py sends 30,000 XADDs of
# 16 KiB (a staged batch of 16 records of 1 KiB is about that size),
# pipelined 64 deep, and prints the server's CPU and minor faults.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
run() {
  local port=$((15000 + RANDOM % 1000)) dir rp
  dir=$(mktemp -d)
  env $2 redis-server --port "$port" --save '' --appendonly no --dir "$dir" $3 >/dev/null 2>&1 &
  rp=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
  echo -n "$1: "
  python3 "$here/fill.py" "$port" 30000 16384 "$rp"
  kill "$rp"; wait "$rp" 2>/dev/null || true
  rm -rf "$dir"
}
for _ in 1 2 3 4; do
  run default "" ""
  run thp "MALLOC_CONF=thp:always" "--disable-thp no"
done

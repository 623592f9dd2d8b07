#!/usr/bin/env bash
# TCP against a Unix socket between ketch and Redis, alternated, with
# benchmark/profile.sh (a fresh Redis and gateway each run).
# Usage: run.sh KETCH_BIN ROUNDS
set -euo pipefail
bin=$1 rounds=$2
cd "$(dirname "$0")/../../.."
for round in $(seq "$rounds"); do
    for preset in "1-topic-16-partitions-1kb 500000 produce" "1-topic-16-partitions-100b 2000000 produce" \
                  "1-topic-16-partitions-1kb 500000 consume" "1-topic-16-partitions-100b 2000000 consume"; do
        set -- $preset
        for via in tcp unix; do
            if [ "$via" = unix ]; then export REDIS_UNIX=1; else unset REDIS_UNIX; fi
            line=$(benchmark/profile.sh "$bin" "$1" "$2" "$3" 2>&1 | head -1)
            echo -e "$round\t$1\t$via\t$line"
        done
    done
done

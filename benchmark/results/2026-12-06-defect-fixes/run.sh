#!/usr/bin/env bash
# A release build before two sessions of defect fixes against one after,
# alternated, with benchmark/profile.sh (a fresh Redis and gateway each run).
# Usage: run.sh BEFORE_BIN AFTER_BIN ROUNDS
set -euo pipefail
before=$1 after=$2 rounds=$3
cd "$(dirname "$0")/../../.."
for round in $(seq "$rounds"); do
    for preset in "1-topic-16-partitions-1kb 500000 produce" "1-topic-16-partitions-100b 2000000 produce" \
                  "1-topic-16-partitions-1kb 500000 consume" "1-topic-16-partitions-100b 2000000 consume"; do
        set -- $preset
        for which in before after; do
            if [ "$which" = before ]; then bin=$before; else bin=$after; fi
            line=$(benchmark/profile.sh "$bin" "$1" "$2" "$3" 2>&1 | head -1)
            echo -e "$round\t$1\t$3\t$which\t$line"
        done
    done
done

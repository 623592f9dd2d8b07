#!/usr/bin/env bash
# A release build from before the sixteenth and seventeenth sessions' defect
# fixes against one after them, alternated: benchmark/profile.sh's four
# presets (a fresh Redis and gateway each run), then the archive's
# throughput and each tier's consume (benchmark/archive-compare.sh).
# Usage: run.sh BEFORE_BIN AFTER_BIN ROUNDS OUT_DIR
# (swapped.tsv: three more produce pairs of 1 KiB records, the after build
# first, by hand with the same profile.sh command.)
set -euo pipefail
before=$1 after=$2 rounds=$3 out=$4
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
for round in $(seq "$rounds"); do
    for preset in "1-topic-16-partitions-1kb 500000 produce" "1-topic-16-partitions-100b 2000000 produce" \
                  "1-topic-16-partitions-1kb 500000 consume" "1-topic-16-partitions-100b 2000000 consume"; do
        set -- $preset
        for which in before after; do
            if [ "$which" = before ]; then bin=$before; else bin=$after; fi
            line=$(benchmark/profile.sh "$bin" "$1" "$2" "$3" 2>&1 | head -1)
            echo -e "$round\t$1\t$3\t$which\t$line" | tee -a "$out/runs.tsv"
        done
    done
done
RECORDS=1000000 benchmark/archive-compare.sh "$before" "$after" "$out/archive" "$rounds" | tee "$out/archive.txt"

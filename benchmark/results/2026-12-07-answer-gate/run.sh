#!/usr/bin/env bash
# A release build from before this session (ad93325, last session's data
# path) against one after it (5edb08f: a Read or Write request waits for
# the answer before it to be written; a response's holds are given back
# after its flush), alternated within each pair, the order swapped every
# other round: benchmark/profile.sh's four presets, a fresh Redis and
# gateway each run.
# Usage: run.sh BEFORE_BIN AFTER_BIN ROUNDS OUT_DIR
# (consume-more.tsv: rounds 3-6 of the 1 KiB consume preset alone, same
# builds, same alternation; release-timing.tsv: 5edb08f against a build of
# it whose responses give their holds back before the flush, as before,
# four rounds alternated; both by hand with the same profile.sh command.)
set -euo pipefail
before=$1 after=$2 rounds=$3 out=$4
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
for round in $(seq "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for preset in "1-topic-16-partitions-1kb 500000 produce" "1-topic-16-partitions-100b 2000000 produce" \
                  "1-topic-16-partitions-1kb 500000 consume" "1-topic-16-partitions-100b 2000000 consume"; do
        set -- $preset
        for which in $order; do
            if [ "$which" = before ]; then bin=$before; else bin=$after; fi
            line=$(benchmark/profile.sh "$bin" "$1" "$2" "$3" 2>&1 | head -1)
            echo -e "$round\t$1\t$3\t$which\t$line" | tee -a "$out/runs.tsv"
        done
    done
done

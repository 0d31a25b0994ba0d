#!/usr/bin/env bash
# Alternates builds of Sundial on one embedded-store scenario of `sundial-load` and records each
# run's load average before and after and the CPU of the load generator with its server
# (`/usr/bin/time`); `sundial-load` itself prints the server's own CPU time.
#   bench/emb-ab.sh OUT ROUNDS "DIR_A DIR_B ..." SCENARIO [ARGS...]
# Each DIR holds a release `sundial` and `sundial-load` (copy them out of target/release per
# build). Example (BENCHMARKS.md, "A poll skips its look while its queue is known empty"):
#   bench/emb-ab.sh out/late 3 "/tmp/before /tmp/after" lateness --tasks 10000
set -euo pipefail
out=$1; rounds=$2; builds=$3; shift 3
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
    for dir in $builds; do
        b=$(basename "$dir")
        l0=$(cut -d' ' -f1 /proc/loadavg)
        /usr/bin/time -f "cpu_user %U cpu_sys %S wall %e" "$dir/sundial-load" \
            --json-out "$out/$b.jsonl" "$@" > "$out/$b-$i.txt" 2>&1
        l1=$(cut -d' ' -f1 /proc/loadavg)
        echo "$b run $i load $l0->$l1 $(grep -h 'lateness p50\|tasks/s\|creates/s' "$out/$b-$i.txt" | tail -1) $(grep -h '^server' "$out/$b-$i.txt" | tr '\n' ' ')$(tail -1 "$out/$b-$i.txt")" \
            | tee -a "$out/summary.txt"
        sleep 5
    done
done

#!/usr/bin/env bash
# One embedded-store `sundial-load` scenario against a server started here, keeping the server's
# own `/metrics` afterwards (its histograms place the time: fire lateness by target, dispatch
# wait, polls whose look was skipped).
#   bench/emb-metrics.sh BUILD_DIR OUT [SCENARIO ARGS...]     (default: --complete-with-poll lateness)
# BUILD_DIR holds a release `sundial` and `sundial-load`; OUT.client.txt, OUT.metrics and
# OUT.server.log are written. Example (BENCHMARKS.md, "Starts on time, and where the drain's
# time goes"): bench/emb-metrics.sh /tmp/new /tmp/m-new-1
set -euo pipefail
b=$1; out=$2; shift 2
[ $# -eq 0 ] && set -- --complete-with-poll lateness
data=$(mktemp -d)
"$b/sundial" server --data-dir "$data" --listen 127.0.0.1:7411 --insecure-no-auth > "$out.server.log" 2>&1 &
sp=$!
trap 'kill $sp 2>/dev/null; wait $sp 2>/dev/null; rm -rf "$data"' EXIT
sleep 1.5
l0=$(cut -d' ' -f1 /proc/loadavg)
"$b/sundial-load" --server http://127.0.0.1:7411 "$@" > "$out.client.txt" 2>&1
l1=$(cut -d' ' -f1 /proc/loadavg)
curl -s http://127.0.0.1:7411/metrics > "$out.metrics"
readied=$(grep 'sundial_fire_lateness_seconds_count{.*target="ready"' "$out.metrics" | awk '{s+=$2} END {print s+0}')
echo "load $l0 -> $l1 $(grep -h 'lateness p50\|tasks/s' "$out.client.txt" | tail -1) readied=$readied"

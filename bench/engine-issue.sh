#!/usr/bin/env bash
# Every latency row of the engine issue, three runs each, one after another (BENCHMARKS.md,
# "The engine issue's rows at 2193348 + pollers woken per ready task"). Run it on a quiet machine:
# nothing else may run meanwhile. Needs PostgreSQL at $PG (a fresh schema per scenario).
# Writes its JSON lines, each run's output and a log with the load average to $OUT, then draws
# the figures (bench/plot.py) into $OUT. Takes about 35 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
OUT=${OUT:-bench/out}
cargo build --release -p sundial-cli -p sundial-bench >&2
B=target/release
mkdir -p "$OUT"
J=$OUT/results.jsonl
log() { echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) | $*" | tee -a "$OUT/log.txt"; }
run() { # name, command...
    local name=$1; shift
    log "start $name: $*"
    /usr/bin/time -f "cpu_user %U cpu_sys %S wall %e" "$@" > "$OUT/$name.txt" 2>&1
    log "end $name"
    sleep 8
}
for i in 1 2 3; do
    run emb-late-p0-$i $B/sundial-load --json-out "$J" lateness
    run emb-drain-w10-$i $B/sundial-load --json-out "$J" drain --workers 10
    run pg-late-$i $B/sundial-load --database-url "$PG" --json-out "$J" lateness
    run pg-drain-w10-$i $B/sundial-load --database-url "$PG" --json-out "$J" drain --workers 10
    run pg-single-$i $B/sundial-load --database-url "$PG" --json-out "$J" single
    run emb-single-$i $B/sundial-load --json-out "$J" single
done
for i in 1 2 3; do
    for w in 1 5 20; do
        run emb-drain-w$w-$i $B/sundial-load --json-out "$J" drain --workers $w
        run pg-drain-w$w-$i $B/sundial-load --database-url "$PG" --json-out "$J" drain --workers $w
    done
    run emb-late-r500-$i $B/sundial-load --json-out "$J" lateness --tasks 10000
    run emb-late-r2000-$i $B/sundial-load --json-out "$J" lateness --tasks 40000
    run emb-late-p100k-$i $B/sundial-load --json-out "$J" lateness --pending 100000
    run emb-late-p1m-$i $B/sundial-load --json-out "$J" lateness --pending 1000000
done
fire_dir=$(mktemp -d)
for i in 1 2 3; do
    run kernel-fire-$i $B/sundial-bench --data-dir "$fire_dir" fire --rate 5000 --secs 20 --pending 1000000
done
rm -rf "$fire_dir"
run schedules $B/sundial-bench schedules --count 100000 --minutes 3
log "done"
if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 bench/plot.py "$J" --out "$OUT"
else
    echo "matplotlib missing: python3 -m pip install -r bench/requirements.txt, then bench/plot.py $J --out $OUT" >&2
fi

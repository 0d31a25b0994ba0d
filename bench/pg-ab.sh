#!/usr/bin/env bash
# Alternates builds of Sundial on one PostgreSQL scenario and records, beside each run's own
# figures, the CPU the whole PostgreSQL server spent on it (its backends' and background
# processes' user + system time, read from /proc; the server must run on this machine).
#   bench/pg-ab.sh OUT ROUNDS "DIR_A DIR_B ..." SCENARIO [ARGS...]
# Before each run the script asks PostgreSQL for a CHECKPOINT (CHECKPOINT=0 to leave it out), so
# that no run starts with a checkpoint due and runs compare with each other.
# Each DIR holds a release `sundial` and `sundial-load` (copy them out of target/release per
# build). Example (BENCHMARKS.md, "PostgreSQL: planned once, attempts per row, grouped claims
# and inserts"): bench/pg-ab.sh out/drain 3 "/tmp/before /tmp/after" drain --workers 10
set -euo pipefail
out=$1; rounds=$2; builds=$3; shift 3
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
mkdir -p "$out"
pg_cpu() { # seconds of CPU of the PostgreSQL server: reaped backends + live processes
    local pm tck c live=0 v
    pm=$(head -1 "${PGPID:-/var/run/postgresql/15-main.pid}")
    tck=$(getconf CLK_TCK)
    c=$(awk '{print $16+$17}' "/proc/$pm/stat")
    for p in $(pgrep -P "$pm"); do
        v=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0)
        live=$((live + v))
    done
    echo "scale=3; ($c + $live) / $tck" | bc
}
for i in $(seq 1 "$rounds"); do
    for dir in $builds; do
        b=$(basename "$dir")
        [ "${CHECKPOINT:-1}" = 1 ] && psql "$PG" -qAt -c CHECKPOINT > /dev/null
        l0=$(cut -d' ' -f1 /proc/loadavg); c0=$(pg_cpu)
        /usr/bin/time -f "cpu_user %U cpu_sys %S wall %e" "$dir/sundial-load" --database-url "$PG" \
            --json-out "$out/$b.jsonl" "$@" > "$out/$b-$i.txt" 2>&1
        c1=$(pg_cpu); l1=$(cut -d' ' -f1 /proc/loadavg)
        echo "$b run $i load $l0->$l1 postgres_cpu_s $(echo "$c1 - $c0" | bc) $(tail -1 "$out/$b-$i.txt")" \
            | tee -a "$out/summary.txt"
        sleep 5
    done
done

#!/usr/bin/env bash
# The database's cost of one task's life (insert, ready, running, succeeded: four transactions)
# on the schema a given `sundial` build creates, without Sundial in the way: pgbench with
# CLIENTS clients for SECS seconds, then WAL bytes and PostgreSQL CPU per task.
#   bench/pg-task-lifecycle.sh [SUNDIAL_BIN] [SECS] [CLIENTS]
# SETUP='sql' runs that SQL on the schema after the migrations (to try a schema change, such as
# dropping an index, before writing it as a migration).
set -euo pipefail
cd "$(dirname "$0")"
bin=${1:-../target/release/sundial}; secs=${2:-10}; clients=${3:-4}
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
psql() { command psql "$PG" -qAt "$@"; }
psql -c "DROP SCHEMA IF EXISTS sundial_lifecycle CASCADE" 2>/dev/null
# The build's own migrations make the schema (the server is stopped once it listens).
"$bin" server --database-url "$PG" --database-schema sundial_lifecycle --listen 127.0.0.1:0 \
    > /dev/null 2>&1 &
srv=$!
for _ in $(seq 1 100); do
    n=$(psql -c "SELECT count(*) FROM pg_tables WHERE schemaname = 'sundial_lifecycle' AND tablename = 'rate_limits'")
    [ "$n" = 1 ] && break
    sleep 0.1
done
sleep 1; kill "$srv"; wait "$srv" 2>/dev/null || true
[ -n "${SETUP:-}" ] && psql -c "$SETUP" > /dev/null
pm=$(head -1 "${PGPID:-/var/run/postgresql/15-main.pid}")
pg_cpu() {
    local c live=0 v
    c=$(awk '{print $16+$17}' "/proc/$pm/stat")
    for p in $(pgrep -P "$pm"); do
        v=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0); live=$((live + v))
    done
    echo "$((c + live))"
}
psql -c "CHECKPOINT" > /dev/null
w0=$(psql -c "SELECT pg_current_wal_lsn()"); c0=$(pg_cpu)
res=$(pgbench "$PG" -n -M prepared -c "$clients" -j 2 -T "$secs" -f pg-task-lifecycle.sql 2>&1)
c1=$(pg_cpu); w1=$(psql -c "SELECT pg_current_wal_lsn()")
n=$(echo "$res" | awk '/number of transactions actually processed/ {print $6}' | cut -d/ -f1)
wal=$(psql -c "SELECT pg_wal_lsn_diff('$w1', '$w0')")
tck=$(getconf CLK_TCK)
echo "tasks $n ($(echo "$n / $secs" | bc)/s) wal_bytes_per_task $((wal / n)) postgres_cpu_us_per_task $(( (c1 - c0) * 1000000 / tck / n )) load $(cut -d' ' -f1-3 /proc/loadavg)"
psql -c "DROP SCHEMA sundial_lifecycle CASCADE" 2>/dev/null

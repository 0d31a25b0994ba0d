#!/usr/bin/env bash
# The kernel benchmarks with the parameters of the kernel issue (see BENCHMARKS.md):
#   schedule throughput (one per call from 64 callers; batches of 1,000),
#   fire lateness at 5,000 tasks/s for 20 s with 10,000 / 1,000,000 / 10,000,000 pending, with memory,
#   store reads per minute while idle with 1,000,000 pending (3 minutes),
#   time from reopening after kill -9 until 100,000 overdue tasks have run.
# Builds in release first. Results go to stdout (progress to stderr). Takes roughly 15-20 minutes
# (a few of them inserting the 10,000,000 pending tasks); needs ~10 GB of free disk.
#
# Usage: bench/kernel.sh [DATA_DIR]   (default: a temporary directory, removed at the end)
# Environment: KEEP=1 keeps the data directory; SKIP_10M=1 skips the 10,000,000-pending run.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p sundial-bench >&2
bin=target/release/sundial-bench

if [[ $# -ge 1 ]]; then
  base=$1
  mkdir -p "$base"
else
  base=$(mktemp -d "${TMPDIR:-/tmp}/sundial-kernel-bench.XXXXXX")
  if [[ "${KEEP:-0}" != 1 ]]; then
    trap 'rm -rf "$base"' EXIT
  fi
fi

echo "# Sundial kernel benchmarks"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "data: $base"
echo

run() {
  echo "\$ sundial-bench $*"
  "$bin" "$@" || echo "(failed with exit status $?)"
  echo "(load average after: $(cut -d' ' -f1-3 /proc/loadavg))"
  echo
}

run --data-dir "$base/schedule" schedule --single 100000 --callers 64 --batches 300 --batch-size 1000
run --data-dir "$base/p10k" fire --rate 5000 --secs 20 --pending 10000
run --data-dir "$base/p1m" fire --rate 5000 --secs 20 --pending 1000000
# The same with more handler slots than the default 64: shows how much of the tail is the
# concurrency limit (a permit is held from the claim until the handler returns).
run --data-dir "$base/p1m" fire --rate 5000 --secs 20 --pending 1000000 --concurrency 1024
# The same load scheduled in calls of 100 instead of 1,000: a due task's claim waits behind whatever
# group commit is running, and a 1,000-task insert is the longest write in the mix.
run --data-dir "$base/p1m" fire --rate 5000 --secs 20 --pending 1000000 --batch 100
if [[ "${SKIP_10M:-0}" != 1 ]]; then
  # Ascending due times make inserting 10,000,000 rows take minutes instead of most of an hour;
  # what is measured afterwards (firing, memory) does not depend on the insertion order.
  run --data-dir "$base/p10m" fire --rate 5000 --secs 20 --pending 10000000 --preload-order ascending
fi
# Reuses the 1,000,000 pending tasks of the fire run above (due 24-48 h ahead).
run --data-dir "$base/p1m" idle --pending 1000000 --secs 180
run --data-dir "$base/recover" recover --tasks 100000

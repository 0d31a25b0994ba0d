#!/usr/bin/env bash
# The HTTP benchmarks of the server issue (see BENCHMARKS.md, section "HTTP"):
#   creates/s one task per request from 64 connections, creates/s in batches of 500 from 8
#   connections, and fire lateness of tasks delivered to 4 long-poll workers at 2,000 tasks/s.
# Each scenario starts a fresh `sundial server` (release build, default settings unless
# SERVER_ARGS says otherwise, e.g. SERVER_ARGS="--durability normal") on a temporary data
# directory; the load generator runs on the same machine and shares its cores.
# Builds in release first. Takes about a minute.
#
# Usage: bench/http.sh [sundial-load arguments]   (default: all scenarios)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p sundial-cli -p sundial-bench >&2
echo "# Sundial HTTP benchmarks"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
target/release/sundial-load --server-args "${SERVER_ARGS:-}" "${@:-all}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

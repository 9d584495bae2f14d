#!/bin/bash
# Recovery time after a kill -9 of a store firing a million recurring schedules (issue 39's target).
# Usage: tools/recover-schedules-after-kill.sh SECONDS [SCHEDULES] [KEEP]
# Creates SCHEDULES (default 1,000,000) schedules every 10 s with random phases
# (`perf --schedules`, 100,000 occurrences/s), kills the process with SIGKILL
# SECONDS after it started, then prints `delaywheel recover --json` (recovery
# without delivering: what is due meanwhile is not caught up, so the time is
# recovery's alone) and the same store's `drain`-free open with delivery.
# With KEEP set, the store directory is kept (and printed).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=target/release/delaywheel
DIR=$(mktemp -d "${TMPDIR:-/tmp}/delaywheel-kill.XXXX")
$BIN perf --schedules "${2:-1000000}" --every-ms 10000 --run-secs 3600 --dir "$DIR" --json > /dev/null 2>&1 &
PID=$!
sleep "$1"
kill -9 "$PID"
wait "$PID" 2>/dev/null || true
$BIN recover --dir "$DIR" --json
echo
if [ -n "${3:-}" ]; then echo "$DIR"; else rm -rf "$DIR"; fi

#!/bin/bash
# Recovery time after a kill -9 in the middle of a burst of puts (issue 4's target).
# Usage: tools/recover-after-kill.sh SECONDS [KEEP]
# Puts 10,000,000 timers 1 hour to 10 years ahead into a fresh store, kills the
# process with SIGKILL after SECONDS, then prints `delaywheel recover --json`.
# With KEEP set, the store directory is kept (and printed) for `wheel-dump DIR audit`.
# PERF_ARGS replaces the workload (tools/recover-schedules-after-kill.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=target/release/delaywheel
DIR=$(mktemp -d "${TMPDIR:-/tmp}/delaywheel-kill.XXXX")
# shellcheck disable=SC2086 # PERF_ARGS is a list of arguments
$BIN perf ${PERF_ARGS:---messages 10000000 --delay-ms 3600000..315360000000 --no-wait} --dir "$DIR" --keep --json > /dev/null 2>&1 &
PID=$!
sleep "$1"
kill -9 "$PID"
wait "$PID" 2>/dev/null || true
$BIN recover --dir "$DIR" --json
echo
if [ -n "${2:-}" ]; then echo "$DIR"; else rm -rf "$DIR"; fi

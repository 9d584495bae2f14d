#!/bin/bash
# Recovery time after a kill -9 of a store firing a million recurring schedules (issue 39's target).
# Usage: tools/recover-schedules-after-kill.sh SECONDS [SCHEDULES] [KEEP]
# Creates SCHEDULES (default 1,000,000) schedules every 10 s with random phases
# (`perf --schedules`: 100,000 occurrences/s), kills the process with SIGKILL
# SECONDS after it started, then prints `delaywheel recover --json`: recovery
# without delivering, so what fell due meanwhile is not caught up and the
# time is recovery's alone. With KEEP set, the store directory is kept (and printed).
set -euo pipefail
cd "$(dirname "$0")/.."
PERF_ARGS="--schedules ${2:-1000000} --every-ms 10000 --run-secs 3600" exec tools/recover-after-kill.sh "$1" "${3:-}"

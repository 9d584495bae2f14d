#!/usr/bin/env bash
# Recurring schedules side by side, in one sitting: NATS's own message
# schedules (`Nats-Schedule: @every 10s`, then the cron `*/10 * * * * *`; one
# subject per schedule, as NATS requires; one nats-server from
# tools/nats/install.sh, a fresh store for each) against `delaywheel perf
# --schedules` on the same workload (every 10 s, then the same cron).
# Each prints one JSON line. Usage: tools/nats-recurring.sh [SCHEDULES] [RUN_SECS]
#   e.g. tools/nats-recurring.sh 100000 60
# NATS's lateness is a fire's stored time in the stream minus the instant its
# schedule's previous fire announced (`Nats-Schedule-Next`); delaywheel's is
# the consumer's receipt minus the occurrence's instant (what it reports).
set -euo pipefail
cd "$(dirname "$0")/.."
schedules=${1:-100000}
run_secs=${2:-60}
server=$(tools/nats/install.sh)
cargo build --release --quiet -p delaywheel-nats -p delaywheel-cli
bin=target/release

work=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nats_schedules() {
  rm -rf "$work/js"
  "$server" -js -sd "$work/js" -a 127.0.0.1 -p "$port" > "$work/server.log" 2>&1 &
  pid=$!
  sleep 1
  echo "-- Nats-Schedule: $1" >&2
  "$bin/delaywheel-nats-load" --nats "nats://127.0.0.1:$port" --mode schedule --replicas 1 \
    --recurring "$1" --messages "$schedules" --run-secs "$run_secs"
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=
}
nats_schedules "@every 10s"
nats_schedules "*/10 * * * * *"
echo "-- delaywheel: every 10 s" >&2
"$bin/delaywheel" perf --schedules "$schedules" --every-ms 10000 --run-secs "$run_secs" --json
echo "-- delaywheel: cron */10 * * * * *" >&2
"$bin/delaywheel" perf --schedules "$schedules" --cron "*/10 * * * * *" --run-secs "$run_secs" --json

#!/usr/bin/env bash
# Recurring schedules side by side, in one sitting: NATS's own message
# schedules (`Nats-Schedule: @every 10s`, then the cron `*/10 * * * * *`; one
# subject per schedule, as NATS requires; one nats-server from
# tools/nats/install.sh, a fresh store for each), the same messages
# published to the NATS tier's schedule intake (one tier node, R1, on the
# same kind of server), and `delaywheel perf --schedules` on the same
# workload (every 10 s, then the same cron).
# Each prints one JSON line. Usage: tools/nats-recurring.sh [SCHEDULES] [RUN_SECS]
#   e.g. tools/nats-recurring.sh 100000 60
# NATS's and the tier's lateness is a fire's stored time in the target stream
# minus the instant its schedule's previous fire announced
# (`Nats-Schedule-Next`, the tier's `Delay-Schedule-Next`); delaywheel's is
# the consumer's receipt minus the occurrence's instant (what it reports).
set -euo pipefail
cd "$(dirname "$0")/.."
schedules=${1:-100000}
run_secs=${2:-60}
server=$(tools/nats/install.sh)
cargo build --release --quiet -p delaywheel-nats -p delaywheel-cli
bin=target/release

work=$(mktemp -d)
pid= node=
cleanup() {
  [[ -n $node ]] && kill -9 "$node" 2>/dev/null
  [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
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
tier_schedules() {
  rm -rf "$work/js" "$work/tier"
  "$server" -js -sd "$work/js" -a 127.0.0.1 -p "$port" > "$work/server.log" 2>&1 &
  pid=$!
  sleep 1
  RUST_LOG=warn,delaywheel=error,delaywheel_nats=warn "$bin/delaywheel-nats" --nats "nats://127.0.0.1:$port" --node-id a \
    --dir "$work/tier" --replicas 1 > "$work/tier.log" 2>&1 &
  node=$!
  sleep 3
  echo "-- the tier's schedule intake: $1" >&2
  "$bin/delaywheel-nats-load" --nats "nats://127.0.0.1:$port" --mode tier --replicas 1 \
    --recurring "$1" --messages "$schedules" --run-secs "$run_secs"
  kill -9 "$node" "$pid"; wait "$node" "$pid" 2>/dev/null || true; node= pid=
}
nats_schedules "@every 10s"
tier_schedules "@every 10s"
nats_schedules "*/10 * * * * *"
tier_schedules "*/10 * * * * *"
echo "-- delaywheel: every 10 s" >&2
"$bin/delaywheel" perf --schedules "$schedules" --every-ms 10000 --run-secs "$run_secs" --json
echo "-- delaywheel: cron */10 * * * * *" >&2
"$bin/delaywheel" perf --schedules "$schedules" --cron "*/10 * * * * *" --run-secs "$run_secs" --json

#!/usr/bin/env bash
# The delay tier under load, beside NATS's own message schedules, in one
# sitting: starts a 3-node JetStream cluster on 127.0.0.1 (nats-server from
# tools/nats/install.sh), tier nodes (2 by default) over 8 partitions in one
# delay stream, and runs delaywheel-nats-load through the tier and then
# through Nats-Schedule. Each prints one JSON line.
# Usage: tools/nats-load.sh [--nodes N] [--streams S] [--partitions P] [--tier-only | --schedule-only]
#                           [--recurring SPEC [--run-secs N]] [MESSAGES] [DELAY_MS] [BAD_TARGETS]
#   e.g. tools/nats-load.sh 100000 2000..10000
#        tools/nats-load.sh --nodes 4 --streams 3 --partitions 24 100000 2000..10000
#        tools/nats-load.sh --recurring "@every 10s" --run-secs 60 20000
# --recurring makes MESSAGES recurring schedules instead (the same
# Nats-Schedule message, published to the tier's schedule intake, then to a
# stream that runs NATS's schedules) and watches their fires for --run-secs.
# BAD_TARGETS adds timers with hostile targets ahead of the good ones through
# the tier (the soak of issue 36): each must be dead-lettered, the target
# stream must keep every fired message, and no good timer may be held up.
# Prebuilt binaries (a machine without the toolchain): DELAYWHEEL_BIN names
# their folder, NATS_SERVER the server.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=2 streams=1 partitions=8 tier_only=0 schedule_only=0 recurring=()
while [[ ${1:-} == --* ]]; do
  case $1 in
    --nodes) nodes=${2:?--nodes needs a count}; shift 2 ;;
    --streams) streams=${2:?--streams needs a count}; shift 2 ;;
    --partitions) partitions=${2:?--partitions needs a count}; shift 2 ;;
    --tier-only) tier_only=1; shift ;;
    --schedule-only) schedule_only=1; shift ;;
    --recurring) recurring+=(--recurring "${2:?--recurring needs a schedule}"); shift 2 ;;
    --run-secs) recurring+=(--run-secs "${2:?--run-secs needs seconds}"); shift 2 ;;
    *) echo "nats-load.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $tier_only == 1 && $schedule_only == 1 ]]; then
  echo "nats-load.sh: --tier-only and --schedule-only leave nothing to run" >&2
  exit 2
fi
messages=${1:-100000}
delay=${2:-2000..10000}
bad=${3:-0}
source tools/nats/setup.sh
start_cluster

run_tier() {
  echo "-- through the tier: $nodes nodes, $partitions partitions, $streams delay stream(s)" >&2
  "$bin/delaywheel-nats-load" --nats "$urls" --mode tier --messages "$messages" --delay-ms "$delay" --bad-targets "$bad" \
    --partitions "$partitions" --streams "$streams" ${recurring[@]+"${recurring[@]}"}
}
if [[ $schedule_only == 0 ]]; then
  for i in $(seq "$nodes"); do start_node "node$i" --partitions "$partitions" --streams "$streams"; done
  sleep 3 # leases taken, shared out
  run_tier
fi
[[ $tier_only == 1 ]] && exit 0
echo "-- through Nats-Schedule: one subject per message, same cluster" >&2
"$bin/delaywheel-nats-load" --nats "$urls" --mode schedule --messages "$messages" --delay-ms "$delay" \
  ${recurring[@]+"${recurring[@]}"}

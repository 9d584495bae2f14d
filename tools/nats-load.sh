#!/usr/bin/env bash
# The delay tier under load, beside NATS's own message schedules, in one
# sitting: starts a 3-node JetStream cluster on 127.0.0.1 (nats-server from
# tools/nats/install.sh), tier nodes (2 by default) over 8 partitions in one
# delay stream, and runs delaywheel-nats-load through the tier and then
# through Nats-Schedule. Each prints one JSON line.
# Usage: tools/nats-load.sh [--nodes N] [--streams S] [--partitions P] [--tier-only]
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
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=2 streams=1 partitions=8 tier_only=0 recurring=() 
while [[ ${1:-} == --* ]]; do
  case $1 in
    --nodes) nodes=${2:?--nodes needs a count}; shift 2 ;;
    --streams) streams=${2:?--streams needs a count}; shift 2 ;;
    --partitions) partitions=${2:?--partitions needs a count}; shift 2 ;;
    --tier-only) tier_only=1; shift ;;
    --recurring) recurring+=(--recurring "${2:?--recurring needs a schedule}"); shift 2 ;;
    --run-secs) recurring+=(--run-secs "${2:?--run-secs needs seconds}"); shift 2 ;;
    *) echo "nats-load.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
messages=${1:-100000}
delay=${2:-2000..10000}
bad=${3:-0}
server=$(tools/nats/install.sh)
cargo build --release --quiet -p delaywheel-nats
bin=target/release

work=$(mktemp -d)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client_ports=("$(port)" "$(port)" "$(port)")
route_ports=("$(port)" "$(port)" "$(port)")
routes=$(printf '"nats-route://127.0.0.1:%s", ' "${route_ports[@]}")
for i in 0 1 2; do
  cat > "$work/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:${client_ports[$i]}
jetstream { store_dir: "$work/n$i" }
cluster { name: load, listen: 127.0.0.1:${route_ports[$i]}, routes: [${routes%, }] }
CONF
  "$server" -c "$work/n$i.conf" > "$work/n$i.log" 2>&1 &
  pids+=($!)
done
urls=$(printf 'nats://127.0.0.1:%s,' "${client_ports[@]}")
urls=${urls%,}

# The first node creates the delay stream and the lease bucket once the
# cluster has a meta leader; it retries until then.
start_node() {
  for _ in $(seq 50); do
    RUST_LOG=warn,delaywheel=error "$bin/delaywheel-nats" --nats "$urls" --node-id "$1" --dir "$work/tier-$1" \
      --partitions "$partitions" --streams "$streams" >> "$work/tier-$1.log" 2>&1 &
    local pid=$!
    sleep 1
    if kill -0 "$pid" 2>/dev/null; then pids+=("$pid"); return; fi
  done
  echo "tier node $1 did not start; see $work/tier-$1.log" >&2
  exit 1
}
for i in $(seq "$nodes"); do start_node "node$i"; done
sleep 3 # leases taken, shared out

echo "-- through the tier: $nodes nodes, $partitions partitions, $streams delay stream(s)" >&2
"$bin/delaywheel-nats-load" --nats "$urls" --mode tier --messages "$messages" --delay-ms "$delay" --bad-targets "$bad" \
  --partitions "$partitions" --streams "$streams" ${recurring[@]+"${recurring[@]}"}
[[ $tier_only == 1 ]] && exit 0
echo "-- through Nats-Schedule: one subject per message, same cluster" >&2
"$bin/delaywheel-nats-load" --nats "$urls" --mode schedule --messages "$messages" --delay-ms "$delay" \
  ${recurring[@]+"${recurring[@]}"}

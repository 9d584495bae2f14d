#!/usr/bin/env bash
# The delay tier under load, beside NATS's own message schedules, in one
# sitting: starts a 3-node JetStream cluster on 127.0.0.1 (nats-server from
# tools/nats/install.sh), 2 tier nodes over 8 partitions, and runs
# delaywheel-nats-load through the tier and then through Nats-Schedule.
# Each prints one JSON line. Usage: tools/nats-load.sh [MESSAGES] [DELAY_MS] [BAD_TARGETS]
#   e.g. tools/nats-load.sh 100000 2000..10000
# BAD_TARGETS adds timers with hostile targets ahead of the good ones through
# the tier (the soak of issue 36): each must be dead-lettered, the target
# stream must keep every fired message, and no good timer may be held up.
set -euo pipefail
cd "$(dirname "$0")/.."
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
      >> "$work/tier-$1.log" 2>&1 &
    local pid=$!
    sleep 1
    if kill -0 "$pid" 2>/dev/null; then pids+=("$pid"); return; fi
  done
  echo "tier node $1 did not start; see $work/tier-$1.log" >&2
  exit 1
}
start_node a
start_node b
sleep 3 # leases taken, half each

echo "-- through the tier: 2 nodes, 8 partitions" >&2
"$bin/delaywheel-nats-load" --nats "$urls" --mode tier --messages "$messages" --delay-ms "$delay" --bad-targets "$bad"
echo "-- through Nats-Schedule: one subject per message, same cluster" >&2
"$bin/delaywheel-nats-load" --nats "$urls" --mode schedule --messages "$messages" --delay-ms "$delay"

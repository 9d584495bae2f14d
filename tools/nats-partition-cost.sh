#!/usr/bin/env bash
# What owning partitions costs a tier node while idle: starts one
# JetStream server (nats-server from tools/nats/install.sh) and one tier node
# with P partitions (R1), waits until it holds them, and prints its threads,
# resident memory and disk. Usage: tools/nats-partition-cost.sh [P ...]
#   e.g. tools/nats-partition-cost.sh 8 64
set -euo pipefail
cd "$(dirname "$0")/.."
server=$(tools/nats/install.sh)
cargo build --release --quiet -p delaywheel-nats
bin=target/release/delaywheel-nats

pids=()
work=
cleanup() {
  kill -9 ${pids[@]+"${pids[@]}"} 2>/dev/null || true
  wait 2>/dev/null || true
  [[ -z $work ]] || rm -rf "$work"
}
trap cleanup EXIT

for partitions in "${@:-8}"; do
  work=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  printf 'listen: 127.0.0.1:%s\njetstream { store_dir: "%s/js" }\n' "$port" "$work" > "$work/server.conf"
  "$server" -c "$work/server.conf" > "$work/server.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  sleep 1
  RUST_LOG=warn "$bin" --nats "nats://127.0.0.1:$port" --node-id a --dir "$work/tier" \
    --partitions "$partitions" --replicas 1 > "$work/tier.log" 2>&1 &
  node_pid=$!
  pids+=("$node_pid")
  for _ in $(seq 60); do
    [[ $(find "$work/tier" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l) -ge $partitions ]] && break
    sleep 0.5
  done
  sleep 3 # every store open and idle
  threads=$(find "/proc/$node_pid/task" -mindepth 1 -maxdepth 1 | wc -l)
  rss_kib=$(awk '/VmRSS/ {print $2}' "/proc/$node_pid/status")
  disk_kib=$(du -sk "$work/tier" | awk '{print $1}')
  stores=$(find "$work/tier" -mindepth 1 -maxdepth 1 -type d | wc -l)
  if ((stores < partitions)); then
    echo "the node opened $stores stores of $partitions partitions within 30 s:" >&2; tail -5 "$work/tier.log" >&2
    exit 1
  fi
  echo "{\"partitions\":$partitions,\"stores\":$stores,\"threads\":$threads,\"rss_kib\":$rss_kib,\"disk_kib\":$disk_kib}"
  cleanup
  pids=()
done

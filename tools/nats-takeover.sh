#!/usr/bin/env bash
# What taking over a partition costs, by how many timers it holds (issue
# 43: failover should not grow with them). On a 3-node JetStream cluster
# (R3), one tier node owns the one partition; PENDING timers due in an hour
# are published to it (delaywheel-nats-load --no-wait) and indexed; a
# second node starts; the first is killed with SIGKILL. Prints one JSON line
# per PENDING: how long until the second node owned the partition (the
# lease running out, --lease-ms) and until it had indexed every timer again
# (read from the delay stream: its `delaytier_indexed_total`).
# Usage: tools/nats-takeover.sh [--lease-ms MS] [PENDING ...]
#   e.g. tools/nats-takeover.sh 100000 300000
# Prebuilt binaries (a machine without the toolchain): DELAYWHEEL_BIN names
# their folder, NATS_SERVER the server.
set -euo pipefail
cd "$(dirname "$0")/.."
lease_ms=3000
if [[ ${1:-} == --lease-ms ]]; then lease_ms=${2:?--lease-ms needs ms}; shift 2; fi
server=${NATS_SERVER:-$(tools/nats/install.sh)}
bin=${DELAYWHEEL_BIN:-target/release}
[[ -n ${DELAYWHEEL_BIN:-} ]] || cargo build --release --quiet -p delaywheel-nats
source tools/nats/cluster.sh

pids=()
work=
cleanup() {
  kill -9 ${pids[@]+"${pids[@]}"} 2>/dev/null || true
  wait 2>/dev/null || true
  [[ -z $work ]] || rm -rf "$work"
} 2>/dev/null
trap cleanup EXIT

# Waits until the sum of a node's series of one metric reaches AT_LEAST, up
# to SECS, polling every 20 ms in one process (a process per poll took a
# quarter of this machine's two cores); prints when (epoch ms).
wait_metric() {
  "$py" - "$@" <<'PY' || { echo "nats-takeover.sh: $2 on :$1 stayed below $3 for ${4}s" >&2; return 1; }
import sys, time, urllib.request
port, name, at_least, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
deadline = time.time() + secs
while time.time() < deadline:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except Exception:  # not up yet, or a reply cut short: ask again
        text = ""
    if sum(float(l.split()[-1]) for l in text.splitlines() if l.split("{")[0].split(" ")[0] == name) >= at_least:
        print(int(time.time() * 1000))
        sys.exit(0)
    time.sleep(0.02)
sys.exit(1)
PY
}
now_ms() { date +%s%3N; }
# The sum of a node's series of one metric, now (0 if it has none yet).
metric_value() {
  "$py" - "$@" <<'PY'
import sys, urllib.request
port, name = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
print(int(sum(float(l.split()[-1]) for l in text.splitlines() if l.split("{")[0].split(" ")[0] == name)))
PY
}

for pending in "${@:-100000}"; do
  work=$(mktemp -d)
  start_cluster
  a_port=$(free_port) b_port=$(free_port)
  node_args=(--partitions 1 --lease-ms "$lease_ms")
  start_node a "${node_args[@]}" --metrics "127.0.0.1:$a_port"
  a_pid=$node_pid
  wait_metric "$a_port" delaytier_partitions_owned 1 30 > /dev/null
  load=$("$bin/delaywheel-nats-load" --nats "$urls" --mode tier --partitions 1 --messages "$pending" \
    --delay-ms 3600000..3600001 --no-wait)
  wait_metric "$a_port" delaytier_indexed_total "$pending" 600 > /dev/null
  # A checkpoint written after every timer was indexed (the next one).
  written=$(metric_value "$a_port" delaytier_checkpoints_written_total)
  wait_metric "$a_port" delaytier_checkpoints_written_total $((written + 1)) 120 > /dev/null
  start_node b "${node_args[@]}" --metrics "127.0.0.1:$b_port"
  sleep 1
  killed=$(now_ms)
  { kill -9 "$a_pid" && wait "$a_pid"; } 2>/dev/null || true
  owned=$(wait_metric "$b_port" delaytier_partitions_owned 1 60)
  indexed=$(wait_metric "$b_port" delaytier_indexed_total "$pending" 600)
  from_checkpoint=$(metric_value "$b_port" delaytier_checkpoint_takeovers_total)
  "$py" -c "
import json, sys
load = json.loads(sys.argv[1])
pending, killed, owned, indexed, lease, from_checkpoint = map(int, sys.argv[2:])
print(json.dumps({'pending': pending, 'lease_ms': lease, 'publish_per_sec': round(load['enqueue_per_sec']),
  'owned_after_ms': owned - killed, 'indexed_after_ms': indexed - killed,
  'reindex_ms': indexed - owned, 'reindex_per_sec': round(pending / max(indexed - owned, 1) * 1000),
  'from_checkpoint': from_checkpoint == 1}))
" "$load" "$pending" "$killed" "$owned" "$indexed" "$lease_ms" "$from_checkpoint"
  # TAKEOVER_LOGS=DIR keeps each run's logs there.
  if [[ -n ${TAKEOVER_LOGS:-} ]]; then
    mkdir -p "$TAKEOVER_LOGS/$pending-$killed" && cp "$work"/*.log "$TAKEOVER_LOGS/$pending-$killed/"
  fi
  cleanup
  pids=() work=
done

#!/usr/bin/env bash
# A tier node killed during a hot second (issue 43): on a 3-node JetStream
# cluster (R3), two tier nodes over 8 partitions; MESSAGES timers (100,000
# by default) due within one second, DELAY_S seconds after the sends begin;
# half a second into that second node a is killed with SIGKILL. Prints what
# delaywheel-nats-load saw at the target (delivered, lost, duplicated, early,
# lateness) and how long after the kill node b owned all 8 partitions
# (`moved_after_ms`; the lease is --lease-ms, 3,000 by default), as one JSON
# line. Exits 1 if a timer was lost or duplicated. Node a writes checkpoints
# every CHECKPOINT_MS (1,000 by default), so b takes a's partitions over
# from them (`taken_from_checkpoints`: how many).
# Usage: tools/nats-hot-kill.sh [--lease-ms MS] [MESSAGES] [DELAY_S] [CHECKPOINT_MS]
# Prebuilt binaries (a machine without the toolchain): DELAYWHEEL_BIN names
# their folder, NATS_SERVER the server.
set -euo pipefail
cd "$(dirname "$0")/.."
lease_ms=3000
if [[ ${1:-} == --lease-ms ]]; then lease_ms=${2:?--lease-ms needs ms}; shift 2; fi
messages=${1:-100000}
delay_s=${2:-20}
checkpoint_ms=${3:-1000}
source tools/nats/setup.sh
start_cluster

b_port=$(free_port)
node_args=(--lease-ms "$lease_ms" --checkpoint-every-ms "$checkpoint_ms")
start_node a "${node_args[@]}"
a_pid=$node_pid
start_node b "${node_args[@]}" --metrics "127.0.0.1:$b_port"
sleep 2 # the partitions shared out
began=$(date +%s%3N)
"$bin/delaywheel-nats-load" --nats "$urls" --mode tier --messages "$messages" \
  --delay-ms "$((delay_s * 1000))..$((delay_s * 1000 + 1000))" > "$work/load.json" &
load_pid=$!
pids+=("$load_pid")
# Half a second into the hot second (the sends began within a few ms of `began`).
sleep_ms=$((began + delay_s * 1000 + 500 - $(date +%s%3N)))
(( sleep_ms > 0 )) || { echo "nats-hot-kill.sh: the sends took past the hot second; raise DELAY_S" >&2; exit 1; }
sleep "$(printf '%d.%03d' $((sleep_ms / 1000)) $((sleep_ms % 1000)))"
killed=$(date +%s%3N)
{ kill -9 "$a_pid" && wait "$a_pid"; } 2>/dev/null || true
moved=$("$py" - "$b_port" <<'PY'
import sys, time, urllib.request
deadline = time.time() + 60
while time.time() < deadline:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read().decode()
    except Exception:  # a reply cut short: ask again
        text = ""
    owned = sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("delaytier_partitions_owned"))
    if owned >= 8:
        print(int(time.time() * 1000))
        sys.exit(0)
    time.sleep(0.02)
sys.exit(1)
PY
) || { echo "nats-hot-kill.sh: b did not own all 8 partitions within 60 s" >&2; exit 1; }
wait "$load_pid"
"$py" - "$work/load.json" "$killed" "$moved" "$lease_ms" "$b_port" <<'PY'
import json, sys, urllib.request
load = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
killed, moved, lease, b_port = map(int, sys.argv[2:])
text = urllib.request.urlopen(f"http://127.0.0.1:{b_port}/metrics", timeout=5).read().decode()
from_checkpoints = sum(float(l.split()[-1]) for l in text.splitlines()
                       if l.startswith("delaytier_checkpoint_takeovers_total"))
report = {"messages": load.get("messages"), "lease_ms": lease, "moved_after_ms": moved - killed,
          "taken_from_checkpoints": int(from_checkpoints)}
report.update({k: v for k, v in load.items() if k in ("delivered", "lost", "duplicated", "early", "lateness_ms")})
print(json.dumps(report))
sys.exit(1 if load.get("lost") or load.get("duplicated") else 0)
PY

#!/usr/bin/env bash
# The multi-core figures of issues 42 and 43, in one prepared run on a
# machine lent for a few minutes (no Rust toolchain there: run
# tools/device/prepare.sh here first and carry device-bin). Writes one file
# per part under $OUT (or ./device-out) and prints them as it goes.
# Usage: tools/device/figures.sh [core] [nats] [takeover]   (all three without arguments)
#   core:     issue 42: perf with 1 and 8 producers (8 M timers over 20 s),
#             3 M timers due at one millisecond with 1 and 4 consumers
#   nats:     issue 43: the tier at saturation with 1, 2 and 4 nodes, and
#             Nats-Schedule, on one 3-node cluster each (300 k, 2..10 s)
#   takeover: issue 43: taking over a partition of 1 M pending timers
# About 2, 4 and 2 minutes on 16 cores. SCALE=N divides every count by N
# (SCALE=20 rehearses the script on a small machine).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-device-out}
mkdir -p "$out"
export DELAYWHEEL_BIN=$PWD/device-bin NATS_SERVER=$PWD/device-bin/nats-server
dw=$DELAYWHEEL_BIN/delaywheel
scale=${SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || { echo "figures.sh: SCALE must be a whole number from 1" >&2; exit 2; }
n() { echo $(( $1 / scale )); }
parts=("$@")
(($#)) || parts=(core nats takeover)
for part in "${parts[@]}"; do
  [[ $part =~ ^(core|nats|takeover)$ ]] || { echo "figures.sh: unknown part $part (core, nats, takeover)" >&2; exit 2; }
done
[[ -x $dw ]] || { echo "figures.sh: no $dw: run tools/device/prepare.sh first and carry device-bin" >&2; exit 2; }

{
  echo "commit $(cat device-bin/COMMIT 2>/dev/null), $(nproc) cores, $(date -u +%FT%TZ)"
  grep -m1 "model name" /proc/cpuinfo
  free -g | head -2
  command -v python3 > /dev/null || echo "no python3: the nats parts cannot run"
} | tee "$out/machine.txt"

# One perf run: its JSON's rates, lateness and busiest threads on one
# line, or a line saying it failed.
perf_line() {
  "$dw" perf "$@" --json 2>> "$out/core.err" | tail -1 | python3 -c "
import json, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    print(json.dumps({'args': sys.argv[1], 'failed': 'no report; see core.err'}))
    sys.exit()
t = d.get('thread_cpu_secs', {})
busy = {k: round(v, 2) for k, v in t.get('threads', {}).items() if v >= 0.1}
print(json.dumps({'args': sys.argv[1], 'puts_per_sec': round(d['enqueue_per_sec']), 'lateness_ms': d['lateness_ms'],
  'lost': d['lost'], 'duplicated': d['duplicated'], 'early': d['early'],
  'burst_last_seen_ms': d.get('burst_last_seen_ms'), 'cpu_secs': t.get('process'), 'threads': busy}))
" "$*"
}

for part in "${parts[@]}"; do
  case $part in
    core)
      for args in "--producers 1" "--producers 8" "--producers 1" "--producers 8"; do
        perf_line --messages "$(n 8000000)" $args --delay-ms 0..20000
      done | tee "$out/core.jsonl"
      for consumers in 1 4 1 4; do
        perf_line --messages "$(n 3000000)" --same-millisecond --consumers "$consumers"
      done | tee -a "$out/core.jsonl"
      ;;
    nats)
      for nodes in 1 2 4; do
        tools/nats-load.sh --tier-only --nodes "$nodes" "$(n 300000)" 2000..10000 | sed "s/^{/{\"tier_nodes\":$nodes,/"
      done 2>> "$out/nats.err" | tee "$out/nats.jsonl"
      # Nats-Schedule alone on the same kind of cluster (no tier node fires).
      tools/nats-load.sh --schedule-only "$(n 300000)" 2000..10000 2>> "$out/nats.err" | tee -a "$out/nats.jsonl"
      ;;
    takeover)
      tools/nats-takeover.sh "$(n 1000000)" 2>> "$out/takeover.err" | tee "$out/takeover.jsonl"
      ;;
  esac
done

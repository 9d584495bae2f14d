#!/bin/bash
# Side-by-side perf runs: alternates two delaywheel binaries, N rounds, so
# both see the same noise of a shared machine. Prints one line per run.
# Usage: tools/perf-ab.sh BIN_A BIN_B N perf ARGS...   (without --json)
# Example: tools/perf-ab.sh /tmp/before /tmp/after 6 perf --messages 1000000 --delay-ms 0..10000
set -euo pipefail
A=$1; B=$2; N=$3; shift 3
for _ in $(seq 1 "$N"); do
  for bin in "$A" "$B"; do
    "$bin" "$@" --json | python3 -c "
import json, sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
l, s = d['lateness_ms'], d['scheduler_lateness_ms']
print('$(basename "$bin")', round(d['enqueue_per_sec'] / 1e6, 2), 'M/s  p99', l['p99'], 'max', l['max'],
      ' wheel p99', s['p99'], 'max', s['max'], ' lost', d['lost'], 'dup', d['duplicated'], 'early', d['early'],
      ' burst last seen', d.get('burst_last_seen_ms'), 'wheel last', d.get('burst_last_delivered_ms'),
      ' cpu s', d.get('thread_cpu_secs', {}).get('process'), ' producer us/put', round(d.get('producer_cpu_us_per_put', 0), 2),
      {k.removeprefix('dw-'): round(v, 2) for k, v in d.get('thread_cpu_secs', {}).get('threads', {}).items() if v >= 0.05})"
  done
done

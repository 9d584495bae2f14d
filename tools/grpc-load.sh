#!/usr/bin/env bash
# The cost of the network layer, measured side by side on one machine:
# timed sends through `delaywheel serve` from concurrent gRPC clients
# (`delaywheel grpc-load`), and the same workload in-process (`delaywheel perf`);
# then end to end at 20k/s, received SimpleConsumer-style and PushConsumer-style.
# Each workload runs on a fresh store. Usage: tools/grpc-load.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cargo build --release --quiet -p delaywheel-cli
bin=target/release/delaywheel
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

serve() {
  rm -rf "$work/store"
  $bin serve --dir "$work/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 > "$work/serve.out" &
  until [[ -s $work/serve.out ]]; do sleep 0.05; done
  endpoint=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grpc'])" "$work/serve.out")
}
stop() { kill -TERM %1; wait %1 || true; }
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.readlines()[-1]); print(eval(sys.argv[1], {}, d))" "$1"; }

for run in $(seq "$runs"); do
  for batch in 1 16 64; do
    serve
    grpc=$($bin grpc-load --endpoint "$endpoint" --messages 200000 --batch "$batch" --senders 8 --inflight 4 \
      --delay-ms 3600000..3600001 --no-receive --json | field 'round(sends_per_sec)')
    stop
    rm -rf "$work/perf"
    local=$($bin perf --dir "$work/perf" --messages 200000 --flush sync --batch "$batch" --producers 32 \
      --delay-ms 3600000..3600001 --no-wait --json 2>/dev/null | field 'round(enqueue_per_sec)')
    echo "run $run: timed sends/s, batch $batch, 32 in flight: grpc $grpc, in-process $local"
  done
  serve
  grpc=$($bin grpc-load --endpoint "$endpoint" --messages 200000 --batch 16 --rate 20000 --delay-ms 1000..3000 --json \
    | field '(lateness_ms["p50"], lateness_ms["p99"], lateness_ms["max"], lost, duplicated)')
  stop
  rm -rf "$work/perf"
  local=$($bin perf --dir "$work/perf" --messages 200000 --flush sync --rate 20000 --producers 8 --delay-ms 1000..3000 \
    --json 2>/dev/null | field '(lateness_ms["p50"], lateness_ms["p99"], lateness_ms["max"], lost)')
  echo "run $run: lateness ms (p50, p99, max, lost[, duplicated]) at 20k/s offered: grpc $grpc, in-process $local"
  serve
  push=$($bin grpc-load --endpoint "$endpoint" --messages 200000 --batch 16 --rate 20000 --delay-ms 1000..3000 --push --json \
    | field '(lateness_ms["p50"], lateness_ms["p99"], lateness_ms["max"], lost, duplicated)')
  stop
  echo "run $run: lateness ms (p50, p99, max, lost, duplicated) at 20k/s offered to PushConsumer-style receivers: $push"
done

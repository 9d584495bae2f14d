#!/usr/bin/env bash
# How long each endpoint the operators' page calls takes on a store with many
# pending timers (default 10 M, due from a minute to ten years ahead, each
# with a key): `delaywheel perf` fills the store, `delaywheel serve` opens it,
# and curl times every request five times; the median is printed.
# Usage: tools/page-endpoints.sh [MESSAGES] [DELAY_RANGE_MS, default 60000..315360000000]
set -euo pipefail
cd "$(dirname "$0")/.."
messages=${1:-10000000}
delays=${2:-60000..315360000000}
cargo build --release --quiet -p delaywheel-cli
bin=target/release/delaywheel
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait; rm -rf "$work"' EXIT

$bin perf --dir "$work/store" --messages "$messages" --delay-ms "$delays" --keys --no-wait --json \
  2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); print('filled:', d['messages'], 'timers in', round(d['enqueue_secs'], 1), 's')"
$bin serve --dir "$work/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 > "$work/serve.out" &
until [[ -s $work/serve.out ]]; do sleep 0.1; done
http=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['http'])" "$work/serve.out")
now=$(( $(date +%s) * 1000 ))

time_it() {
  local path=$1 times=()
  for _ in 1 2 3 4 5; do
    times+=("$(curl -s -o /dev/null -w '%{time_total}' "http://$http$path")")
  done
  printf '%-70s median %6.1f ms\n' "$path" "$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p | awk '{print $1 * 1000}')"
}
time_it "/"
time_it "/overview"
time_it "/pending/counts?step=1000&buckets=300"
time_it "/pending/counts?step=60000&buckets=1440"
time_it "/pending/counts?step=86400000&buckets=3653"
time_it "/pending?from=$now&to=$((now + 3600000))&limit=500"
time_it "/pending?topic=PerfTopic&key=order-4242"
curl -s "http://$http/pending/counts?step=86400000&buckets=3653" \
  | python3 -c "import json,sys; d=json.load(sys.stdin); print('pending, counted by day:', sum(d['counts']) + d['after'])"
curl -s "http://$http/pending?topic=PerfTopic&key=order-4242" \
  | python3 -c "import json,sys; print('timers of key order-4242:', len(json.load(sys.stdin)['timers']))"

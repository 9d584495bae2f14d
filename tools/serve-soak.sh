#!/usr/bin/env bash
# A bounded soak of `delaywheel serve` under hostile and careless input, on
# loopback only: while `delaywheel grpc-load` sends 10,000 good timed
# messages and receives and acks each, `delaywheel grpc-soak` holds 1,000
# silent connections (half on each endpoint), runs 500 long polls of one
# group and sends a message whose properties leave no room for its retry copy.
# Passes when every good message was delivered once, the poison was refused,
# the server closed the silent connections and answered every poll, and
# /healthz is 200. Usage: tools/serve-soak.sh [GOOD_MESSAGES]
set -euo pipefail
cd "$(dirname "$0")/.."
messages=${1:-10000}
cargo build --release --quiet -p delaywheel-cli
bin=target/release/delaywheel
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

$bin serve --dir "$work/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 --idle-timeout-secs 10 > "$work/serve.out" &
until [[ -s $work/serve.out ]]; do sleep 0.05; done
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$work/serve.out" "$1"; }
grpc=$(field grpc)
http=$(field http)

$bin grpc-soak --endpoint "$grpc" --http "$http" --idle 1000 --polls 500 --poll-secs 20 --watch-secs 40 \
  > "$work/soak.json" &
soak=$!
$bin grpc-load --endpoint "$grpc" --messages "$messages" --batch 16 --delay-ms 1000..3000 --json > "$work/load.json"
wait $soak
echo "grpc-load: $(tail -n 1 "$work/load.json")"
echo "grpc-soak: $(tail -n 1 "$work/soak.json")"
kill -TERM %1
wait %1

python3 - "$work/load.json" "$work/soak.json" "$messages" <<'PY'
import json, sys
load = json.loads(open(sys.argv[1]).read().splitlines()[-1])
soak = json.loads(open(sys.argv[2]).read().splitlines()[-1])
want = int(sys.argv[3])
checks = {
    "every good message delivered": load["received"] == want and load["lost"] == 0,
    "none twice, none early": load["duplicated"] == 0 and load["early"] == 0,
    "the poison refused": soak["poison_send"]["code"] == "MESSAGE_PROPERTIES_TOO_LARGE",
    "every silent connection closed": soak["idle_closed_by_server"] == soak["idle_opened"],
    "every long poll answered": soak["polls_answered"] == soak["polls"],
    "healthy": soak["healthz"].endswith("200 OK"),
}
for name, ok in checks.items():
    print(("ok   " if ok else "FAIL ") + name)
sys.exit(0 if all(checks.values()) else 1)
PY

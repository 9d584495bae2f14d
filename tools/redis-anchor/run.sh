#!/bin/bash
# The side-by-side for durable puts: Redis 7 with `appendfsync always`
# (tools/redis-anchor/anchor.py) against `delaywheel perf --flush sync`,
# alternating, ROUNDS times each (default 3). Installs redis-server (Debian)
# and a venv with redis and hiredis (PyPI) on first use. Never part of cargo test.
# Usage: tools/redis-anchor/run.sh [ROUNDS] [DELAYWHEEL_BIN]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-3}
bin=${2:-$here/../../target/release/delaywheel}
if ! command -v redis-server >/dev/null; then
  sudo_=""; [ "$(id -u)" -ne 0 ] && sudo_=sudo
  $sudo_ apt-get install -y redis-server >/dev/null || { $sudo_ apt-get update >/dev/null && $sudo_ apt-get install -y redis-server >/dev/null; }
fi
venv=$here/.venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet redis hiredis
fi
[ -x "$bin" ] || (cd "$here/../.." && cargo build --release -p delaywheel-cli)
for _ in $(seq 1 "$rounds"); do
  "$venv/bin/python" "$here/anchor.py" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('redis appendfsync always, pipelined 1000:', round(d['per_sec']), 'ZADD/s')"
  "$bin" perf --messages 1000000 --flush sync --producers 2 --inflight 16384 --delay-ms 60000..60001 --no-wait --json \
    | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('delaywheel sync, 2 producers x 16384 in flight:', round(d['enqueue_per_sec']), 'puts/s, lost', d['lost'])"
done

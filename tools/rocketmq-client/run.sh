#!/usr/bin/env bash
# The real-client tests of `delaywheel serve`: builds the binary, makes a
# Python venv with the official RocketMQ 5 client (from PyPI), and runs
# test_serve.py (producer, SimpleConsumer, restarts, credentials) and
# test_consumers.py (PushConsumer, nack, dead letters), each against a server
# it starts itself. `.ci/run` runs this.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=target/rocketmq-venv
if [[ ! -x $venv/bin/python ]] || ! $venv/bin/python -c 'import rocketmq' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tools/rocketmq-client/requirements.txt
fi
cargo build --release --quiet -p delaywheel-cli
# Each server's store reserves a 1 GiB segment: the scripts make their stores
# under one scratch directory, removed when both pass (kept to read otherwise).
scratch=$(mktemp -d -t delaywheel-client-tests-XXXXXX)
trap 'echo "stores kept in $scratch" >&2' ERR
export TMPDIR=$scratch
"$venv/bin/python" tools/rocketmq-client/test_serve.py target/release/delaywheel "$@"
"$venv/bin/python" tools/rocketmq-client/test_consumers.py target/release/delaywheel
rm -rf "$scratch"

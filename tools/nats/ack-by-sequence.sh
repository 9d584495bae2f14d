#!/usr/bin/env bash
# Checks what a checkpoint takeover of the NATS tier would rely on (see the
# README, "Reading"): a JetStream work-queue message handed to one
# connection's pull is removed by an acknowledgement that another
# connection builds from the stream sequence alone
# ($JS.ACK.<stream>.<consumer>.1.<seq>.1.0.0). One nats-server (from
# tools/nats/install.sh), the official Python client nats-py (from PyPI,
# into target/nats-py-venv). Prints what happened; exits 1 if the
# sequences acknowledged so are still in the stream.
set -euo pipefail
cd "$(dirname "$0")/../.."
server=$(tools/nats/install.sh)
venv=target/nats-py-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "nats-py==2.*"
work=$(mktemp -d)
trap 'kill -9 $server_pid 2>/dev/null || true; rm -rf "$work"' EXIT
port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$server" -js -sd "$work/js" -a 127.0.0.1 -p "$port" > "$work/server.log" 2>&1 &
server_pid=$!
disown # killed at exit; not a job for the shell to report
sleep 1
"$venv/bin/python" - "nats://127.0.0.1:$port" <<'PY'
import asyncio, sys
import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

async def main(url):
    a = await nats.connect(url)
    js = a.jetstream()
    await js.add_stream(StreamConfig(name="S", subjects=["w.>"], retention=RetentionPolicy.WORK_QUEUE))
    await js.add_consumer("S", ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT, ack_wait=3600))
    for i in range(5):
        await js.publish("w.x", f"m{i}".encode())
    handed = await (await js.pull_subscribe_bind("C", "S")).fetch(5, timeout=2)
    print("connection A was handed", [m.metadata.sequence.stream for m in handed], "and closes unacknowledged")
    await a.close()
    b = await nats.connect(url)
    jsb = b.jetstream()
    for seq in (2, 4):
        await b.request(f"$JS.ACK.S.C.1.{seq}.1.0.0", b"+ACK", timeout=2)
        print(f"connection B acknowledged stream sequence {seq} by a subject it built")
    left = []
    for seq in range(1, 6):
        try:
            await jsb.get_msg("S", seq)
            left.append(seq)
        except nats.js.errors.NotFoundError:
            pass
    pending = (await jsb.consumer_info("S", "C")).num_ack_pending
    print("left in the stream:", left, "- the consumer's unacknowledged:", pending)
    await b.close()
    sys.exit(0 if left == [1, 3, 5] and pending == 3 else 1)

asyncio.run(main(sys.argv[1]))
PY
"$server" --version

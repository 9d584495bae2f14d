#!/usr/bin/env bash
# Checks what a checkpoint takeover of the NATS tier would rely on (see the
# README, "Reading"): a JetStream work-queue message handed to one
# connection's pull is removed by an acknowledgement that another
# connection builds from the stream sequence alone
# ($JS.ACK.<stream>.<consumer>.1.<seq>.1.0.0), and the durable consumer,
# kept, hands a new puller only what it never handed out; and a pull
# request left waiting by a puller killed with SIGKILL is dropped with its
# connection, not handed the next message.
# Twice: on one server, and on a 3-server cluster with the stream and its
# consumer replicated (R3), connection A on n0 and B on n2, where both
# leaders are then made to step down and the result is read again from the
# new ones. nats-server from tools/nats/install.sh, the official Python
# client nats-py (from PyPI, into target/nats-py-venv). Prints what
# happened; exits 1 if either check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
server=$(tools/nats/install.sh)
venv=target/nats-py-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "nats-py==2.*"
work=$(mktemp -d)
pids=()
trap 'kill -9 ${pids[@]+"${pids[@]}"} 2>/dev/null || true; rm -rf "$work"' EXIT
# shellcheck source=tools/nats/cluster.sh
source tools/nats/cluster.sh

check() { # URL_A URL_B REPLICAS
  "$venv/bin/python" - "$@" <<'PY'
import asyncio, sys
import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

async def state(js):
    left = []
    for seq in range(1, 7):
        try:
            await js.get_msg("S", seq)
            left.append(seq)
        except nats.js.errors.NotFoundError:
            pass
    return left, (await js.consumer_info("S", "C")).num_ack_pending

async def leader(js, of):
    info = await (js.consumer_info("S", "C") if of == "consumer" else js.stream_info("S"))
    return info.cluster.leader if info.cluster else None

async def step_down(nc, of, api):
    # The new leader must hold what the old one applied: the acknowledgements included.
    js = nc.jetstream()
    old = await leader(js, of)
    await nc.request(f"$JS.API.{api}", b"", timeout=5)
    for _ in range(100):
        await asyncio.sleep(0.1)
        try:
            new = await leader(js, of)
        except Exception:  # no leader yet
            continue
        if new and new != old:
            print(f"the {of}'s leader moved from {old} to {new}")
            return True
    print(f"the {of}'s leader did not move from {old}")
    return False

PULLER = """
import asyncio, sys, nats
async def pull(url):
    nc = await nats.connect(url)
    sub = await nc.jetstream().pull_subscribe_bind("C", "S")
    print("waiting", flush=True)
    await sub.fetch(1, timeout=60)
asyncio.run(pull(sys.argv[1]))
"""

async def killed_puller(url, js):
    # An owner killed while its pull request waits: is the next message
    # handed to that request (to no one), or to the next owner's pull?
    puller = await asyncio.create_subprocess_exec(sys.executable, "-c", PULLER, url,
                                                  stdout=asyncio.subprocess.PIPE)
    await puller.stdout.readline()
    await asyncio.sleep(0.5)
    waiting = (await js.consumer_info("S", "C")).num_waiting
    puller.kill()
    await puller.wait()
    await js.publish("w.x", b"m6")
    info = await js.consumer_info("S", "C")
    try:
        got = [m.metadata.sequence.stream for m in await (await js.pull_subscribe_bind("C", "S")).fetch(1, timeout=3)]
    except nats.errors.TimeoutError:
        got = []
    print(f"a puller killed (SIGKILL) while its request waited ({waiting} waiting): the message published"
          f" next has delivered sequence {info.delivered.stream_seq}, and the next pull gets {got}")
    return waiting == 1 and got == [7]

async def main(url_a, url_b, replicas):
    replicas = int(replicas)
    a = await nats.connect(url_a)
    js = a.jetstream()
    for attempt in range(50):  # a cluster just elected may not place R3 yet
        try:
            await js.add_stream(StreamConfig(name="S", subjects=["w.>"], retention=RetentionPolicy.WORK_QUEUE,
                                             num_replicas=replicas))
            break
        except nats.js.errors.APIError:
            if attempt == 49:
                raise
            await asyncio.sleep(0.2)
    await js.add_consumer("S", ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT, ack_wait=3600))
    for i in range(5):
        await js.publish("w.x", f"m{i}".encode())
    handed = await (await js.pull_subscribe_bind("C", "S")).fetch(5, timeout=5)
    print("connection A was handed", [m.metadata.sequence.stream for m in handed], "and closes unacknowledged")
    await a.close()
    b = await nats.connect(url_b)
    jsb = b.jetstream()
    for seq in (2, 4):
        await b.request(f"$JS.ACK.S.C.1.{seq}.1.0.0", b"+ACK", timeout=5)
        print(f"connection B acknowledged stream sequence {seq} by a subject it built")
    checks = [("after the acknowledgements", await state(jsb))]
    ok = True
    if replicas > 1:
        ok &= await step_down(b, "consumer", "CONSUMER.LEADER.STEPDOWN.S.C")
        ok &= await step_down(b, "stream", "STREAM.LEADER.STEPDOWN.S")
        checks.append(("after both leaders stepped down", await state(jsb)))
    for when, (left, pending) in checks:
        print(f"{when}: left in the stream {left}, the consumer's unacknowledged {pending}")
        ok &= left == [1, 3, 5] and pending == 3
    # The kept consumer hands B only what it never handed out: not 1, 3, 5.
    await jsb.publish("w.x", b"m5")
    again = await (await jsb.pull_subscribe_bind("C", "S")).fetch(5, timeout=3)
    fresh = [m.metadata.sequence.stream for m in again]
    print("a new pull on the kept consumer gets", fresh)
    ok &= fresh == [6]
    ok &= await killed_puller(url_a, jsb)
    await b.close()
    sys.exit(0 if ok else 1)

asyncio.run(main(*sys.argv[1:]))
PY
}

"$server" --version
echo "== one server"
port=$(free_port)
"$server" -js -sd "$work/js" -a 127.0.0.1 -p "$port" > "$work/server.log" 2>&1 &
pids+=($!)
disown -a # killed at exit; not jobs for the shell to report
sleep 1
check "nats://127.0.0.1:$port" "nats://127.0.0.1:$port" 1
echo "== three servers, R3"
start_cluster
disown -a
IFS=, read -r url0 _ url2 <<< "$urls"
check "$url0" "$url2" 3

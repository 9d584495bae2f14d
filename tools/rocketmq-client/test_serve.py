"""The official RocketMQ 5 Python client against `delaywheel serve`.

Sends 1,000 normal and 1,000 timed messages (due 1-5 s ahead) and one due in
10 years; recalls 100 timed ones; receives everything with a SimpleConsumer,
acking all but 10; then checks that exactly the un-recalled timed messages
arrived, none before its delivery timestamp; that the 10 un-acked came back
after their invisible duration; that the 10-year one is pending
(`/pending`); and that after `kill -9` and a restart nothing acked comes back
and nothing unacked is lost. Then that a send the client repeats with the
same message id (as its retry after a timeout does) answers the first
send's receipt and is delivered once, across a restart too. Last, with
`--access-key`, that a client with the right credentials sends and one with
a wrong secret is refused. Exit 0 when everything holds.

Usage: test_serve.py path/to/delaywheel
"""

import json
import logging
import os
import sys
import tempfile
import time

from common import Server, wait_until
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.v5.util import MessageIdCodec

TOPIC = "Orders"
GROUP = "OrderService"
INVISIBLE_S = 4
TEN_YEARS_S = 10 * 365 * 86400
checks = []


def check(condition, what):
    checks.append(what)
    if not condition:
        raise AssertionError(what)


def message(body, deliver_at_s=None, key=None):
    m = Message()
    m.topic, m.body = TOPIC, body.encode()
    if deliver_at_s is not None:
        # The client puts this number into the protocol's Timestamp.seconds.
        m.delivery_timestamp = deliver_at_s
    if key:
        m.keys = key
    return m


def receive_until(consumer, want, timeout, on_message):
    """Receives until `want()` is true or `timeout` s pass; calls `on_message` for each."""
    deadline = time.time() + timeout
    while not want() and time.time() < deadline:
        # Before the call: the server makes a message invisible after this instant.
        asked_at = time.time()
        for m in consumer.receive(32, INVISIBLE_S):
            on_message(m, asked_at)


def main(binary):
    logging.getLogger("rocketmq").setLevel(logging.ERROR)
    store = tempfile.mkdtemp(prefix="delaywheel-client-test-")
    servers = []
    try:
        run(binary, store, servers)
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.kill9()


def run(binary, store, servers):
    server = Server(binary, store).start()
    servers.append(server)
    config = ClientConfiguration(server.endpoint, Credentials())
    producer = Producer(config, (TOPIC,))
    producer.startup()

    started = time.time()
    for i in range(1000):
        producer.send(message(f"normal-{i}", key=f"order-{i}"))
    timed, recalled = {}, []
    for i in range(1000):
        # Due 1 to 5 s after its send (whole seconds: the client sends seconds).
        # Every tenth is due 5 s ahead and recalled right away, however slow the machine.
        delay_s = 5 if i % 10 == 0 else 1 + i % 4
        receipt = producer.send(message(f"timed-{i}", deliver_at_s=int(time.time()) + delay_s))
        timed[f"timed-{i}"] = receipt
        if i % 10 == 0:
            producer.recall_message(TOPIC, receipt.recall_handle)
            recalled.append(f"timed-{i}")
    now_s = int(time.time())
    far = producer.send(message("ten-years", deliver_at_s=now_s + TEN_YEARS_S, key="far"))
    print(f"sent 2,001 and recalled 100 in {time.time() - started:.1f} s", flush=True)
    check(far.recall_handle, "a timed send's receipt has a recall handle")

    consumer = SimpleConsumer(config, GROUP, {TOPIC: FilterExpression()}, await_duration=2)
    consumer.startup()
    first_seen, redelivered, early, attempts = {}, {}, [], {}
    unacked = {f"normal-{i}" for i in range(10)}

    def on_message(m, at):
        body = m.body.decode()
        attempts.setdefault(body, []).append(m.delivery_attempt)
        if m.delivery_timestamp and time.time() * 1000 < m.delivery_timestamp:
            early.append(body)
        if body in first_seen:
            redelivered[body] = time.time()
            consumer.ack(m)
            return
        first_seen[body] = at
        if body not in unacked:
            consumer.ack(m)

    want = 1000 + 900
    receive_until(consumer, lambda: len(first_seen) >= want and len(redelivered) >= 10, 60, on_message)
    expected = {f"normal-{i}" for i in range(1000)} | (set(timed) - set(recalled))
    check(set(first_seen) == expected,
          f"exactly the normal and un-recalled timed messages arrive ({len(first_seen)} of {len(expected)}; "
          f"missing {sorted(expected - set(first_seen))[:5]}, unexpected {sorted(set(first_seen) - expected)[:5]})")
    check(not early, f"no timed message arrives before its delivery timestamp ({early[:5]})")
    check(set(redelivered) == unacked, f"the 10 un-acked come back ({sorted(redelivered)})")
    check(all(redelivered[b] - first_seen[b] >= INVISIBLE_S for b in unacked),
          "not before their invisible duration ended")
    check(all(attempts[b] == [1, 2] for b in unacked), "as delivery attempt 2")
    check(all(attempts[b] == [1] for b in expected - unacked), "every acked message came once")

    status, body = server.get(f"/pending?from={(now_s + TEN_YEARS_S - 60) * 1000}&to={(now_s + TEN_YEARS_S + 60) * 1000}")
    pending = json.loads(body)["timers"]
    check(status == 200 and [(t["topic"], t["key"]) for t in pending] == [(TOPIC, "far")],
          f"/pending lists the 10-year timer ({pending})")
    status, metrics = server.get("/metrics")
    check(status == 200 and "delaywheel_pending_timers" in metrics and "delaywheel_grpc_acks_total" in metrics,
          "/metrics scrapes")
    check(server.get("/healthz")[0] == 200, "/healthz answers")

    # Before the kill: 50 received of which 25 acked, 20 timers not yet due.
    for i in range(50):
        producer.send(message(f"before-kill-{i}"))
    kill_s = int(time.time())
    for i in range(20):
        producer.send(message(f"due-after-kill-{i}", deliver_at_s=kill_s + 3))
    got = {}

    def before_kill(m, at):
        body = m.body.decode()
        check(body.startswith("before-kill-") and body not in got, f"only the new messages, once each ({body})")
        got[body] = m
        if int(body.rsplit("-", 1)[1]) % 2 == 0:
            consumer.ack(m)

    receive_until(consumer, lambda: len(got) >= 50, 30, before_kill)
    check(len(got) == 50, f"the 50 new messages arrive before the kill ({len(got)})")
    producer.shutdown()
    consumer.shutdown()
    server.kill9()
    print("killed the server with SIGKILL; restarting it on the same store", flush=True)

    server = Server(binary, store, server.grpc_port, server.http_port).start()
    servers.append(server)
    consumer = SimpleConsumer(ClientConfiguration(server.endpoint, Credentials()), GROUP,
                              {TOPIC: FilterExpression()}, await_duration=2)
    consumer.startup()
    after = {}

    def after_restart(m, at):
        body = m.body.decode()
        after.setdefault(body, []).append(m.delivery_attempt)
        consumer.ack(m)

    unacked_before = {f"before-kill-{i}" for i in range(1, 50, 2)}
    due = {f"due-after-kill-{i}" for i in range(20)}
    receive_until(consumer, lambda: set(after) >= unacked_before | due, 30, after_restart)
    # Anything else would come within another invisible duration: wait one out.
    receive_until(consumer, lambda: False, INVISIBLE_S + 2, after_restart)
    check(set(after) == unacked_before | due,
          f"after kill -9: exactly the unacked and the timers come, nothing acked "
          f"(unexpected {sorted(set(after) - unacked_before - due)[:5]}, "
          f"missing {sorted(unacked_before | due - set(after))[:5]})")
    check(all(len(a) == 1 for a in after.values()), "each once")
    status, body = server.get(f"/pending?from={(now_s + TEN_YEARS_S - 60) * 1000}&to={(now_s + TEN_YEARS_S + 60) * 1000}")
    check([t["key"] for t in json.loads(body)["timers"]] == ["far"], "the 10-year timer is still pending")
    consumer.shutdown()
    code = server.stop()
    check(code == 0, f"SIGTERM closes the store and exits 0 (exit {code})")
    check_resend(binary, servers)
    check_signatures(binary, store, servers)
    print(f"ok: {len(checks)} checks passed in {time.time() - started:.0f} s")


class OneMessageId:
    """Every send in the block carries one message id, as the client's own
    retry of a send whose answer timed out does (`Producer.__send` reuses the
    id that `send` drew from `MessageIdCodec`)."""

    def __init__(self, message_id):
        self.message_id, self.saved = message_id, None

    def __enter__(self):
        self.saved = MessageIdCodec.next_message_id
        MessageIdCodec.next_message_id = lambda codec: self.message_id

    def __exit__(self, *exc):
        MessageIdCodec.next_message_id = self.saved


def check_resend(binary, servers):
    """A send repeated with one message id answers the first receipt and is
    delivered once, before and after a restart; a fresh id is a new message."""
    store = tempfile.mkdtemp(prefix="delaywheel-resend-test-")
    server = Server(binary, store).start()
    servers.append(server)
    config = ClientConfiguration(server.endpoint, Credentials())
    producer = Producer(config, (TOPIC,))
    producer.startup()
    due_s = int(time.time()) + 3
    with OneMessageId("0DW0RESEND0000000000000001"):
        first = producer.send(message("resent", deliver_at_s=due_s))
        again = producer.send(message("resent, second copy", deliver_at_s=due_s))
    fresh = producer.send(message("fresh", deliver_at_s=due_s))
    check(again.message_id == first.message_id and again.offset == first.offset
          and again.recall_handle == first.recall_handle,
          f"a resend with one message id answers the first receipt ({first.offset}, {again.offset})")
    check(fresh.offset != first.offset, "a fresh message id is a new message")
    producer.shutdown()
    server.kill9()

    server = Server(binary, store, server.grpc_port, server.http_port).start()
    servers.append(server)
    config = ClientConfiguration(server.endpoint, Credentials())
    producer = Producer(config, (TOPIC,))
    producer.startup()
    with OneMessageId("0DW0RESEND0000000000000001"):
        after_kill = producer.send(message("resent, third copy", deliver_at_s=due_s))
    check(after_kill.offset == first.offset, "and so does a resend after kill -9")
    producer.shutdown()

    consumer = SimpleConsumer(config, GROUP, {TOPIC: FilterExpression()}, await_duration=2)
    consumer.startup()
    bodies = []

    def on_message(m, at):
        bodies.append(m.body.decode())
        consumer.ack(m)

    receive_until(consumer, lambda: len(bodies) >= 2, 30, on_message)
    # A second copy would be due at the same second: wait a little longer for it.
    receive_until(consumer, lambda: False, 3, on_message)
    check(sorted(bodies) == ["fresh", "resent"], f"the resent message is delivered once ({bodies})")
    consumer.shutdown()
    check(server.stop() == 0, "the resend server stops cleanly")


def check_signatures(binary, store, servers):
    """A server with an access key: the client's signature is checked."""
    secret_file = os.path.join(store, "..", os.path.basename(store) + ".secret")
    with open(secret_file, "w") as f:
        f.write("s3cret\n")
    signed = Server(binary, tempfile.mkdtemp(prefix="delaywheel-auth-test-"),
                    extra_args=["--access-key", "ak1", "--secret-key-file", secret_file]).start()
    servers.append(signed)
    producer = Producer(ClientConfiguration(signed.endpoint, Credentials("ak1", "s3cret")), (TOPIC,))
    producer.startup()
    receipt = producer.send(message("signed"))
    check(bool(receipt.message_id), "with the right access key and secret a send is answered")
    producer.shutdown()
    refused = None
    try:
        wrong = Producer(ClientConfiguration(signed.endpoint, Credentials("ak1", "wrong")), (TOPIC,))
        wrong.startup()
        wrong.send(message("forged"))
        wrong.shutdown()
    except Exception as e:  # the client raises its own exception types
        refused = e
    check(refused is not None, "with a wrong secret the client is refused")
    check(signed.stop() == 0, "the signed server stops cleanly")
    os.remove(secret_file)


if __name__ == "__main__":
    main(sys.argv[1])

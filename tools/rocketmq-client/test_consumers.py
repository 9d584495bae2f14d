"""The official RocketMQ 5 Python client's consumers against `delaywheel serve`,
beyond test_serve.py's SimpleConsumer:

- a PushConsumer consumes 100 normal and 50 timed messages through its
  listener, none early; the listener fails 5 of them once, and each of those
  comes back exactly once more, as attempt 2, after its backoff (the settings
  answer's first: 1 s); nothing else is consumed twice;
- a RocketMQ 4 style legacy delay level (user property `DELAY`: level 2 is
  5 s) is handed out not before its level's delay;
- a SimpleConsumer's nack (`change_invisible_duration`, 1 s) brings its
  message back exactly once, as attempt 2, not before the second;
- a message nacked on every attempt goes to the group's dead-letter topic
  after the last (16), and a SimpleConsumer of another group reads it from
  `%DLQ%<group>`, naming its origin topic and message id;
- FIFO: 3 message groups of 10 messages each, sent interleaved, are consumed
  by a PushConsumer in send order within each group, even where its listener
  fails one once: the group's next message waits until the retry succeeded;
- namespaces: clients of two namespaces use the same topic and group names,
  and each receives only its own namespace's messages.

Exit 0 when everything holds. Usage: test_consumers.py path/to/delaywheel
"""

import logging
import sys
import tempfile
import threading
import time

from common import Server, wait_until
from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message,
                      MessageListener, Producer, PushConsumer, SimpleConsumer)

checks = []


def check(condition, what):
    checks.append(what)
    if not condition:
        raise AssertionError(what)


def message(topic, body, deliver_at_s=None, group=None):
    m = Message()
    m.topic, m.body = topic, body.encode()
    if deliver_at_s is not None:
        m.delivery_timestamp = deliver_at_s
    if group is not None:
        m.message_group = group
    return m


class Listener(MessageListener):
    """Records every consumption; fails the bodies in `fail_once` on their first attempt."""

    def __init__(self, fail_once):
        self.fail_once = set(fail_once)
        self.lock = threading.Lock()
        self.consumed = {}  # body -> [(attempt, time, result)]
        self.early = []

    def consume(self, m):
        body, now = m.body.decode(), time.time()
        if m.delivery_timestamp and now * 1000 < m.delivery_timestamp:
            self.early.append(body)
        result = ConsumeResult.SUCCESS
        if body in self.fail_once and m.delivery_attempt == 1:
            result = ConsumeResult.FAILURE
        with self.lock:
            self.consumed.setdefault(body, []).append((m.delivery_attempt, now, result))
        return result

    def successes(self):
        with self.lock:
            return sum(1 for seen in self.consumed.values() for (_, _, r) in seen if r == ConsumeResult.SUCCESS)


def push_consumer(config, producer):
    topic = "Jobs"
    bodies = [f"job-{i}" for i in range(100)]
    now_s = int(time.time())
    timed = [f"timed-{i}" for i in range(50)]
    for body in bodies:
        producer.send(message(topic, body))
    for i, body in enumerate(timed):
        producer.send(message(topic, body, deliver_at_s=now_s + 1 + i % 2))
    everything = bodies + timed
    failing = ["job-3", "job-40", "job-77", "timed-5", "timed-30"]
    listener = Listener(failing)
    consumer = PushConsumer(config, "Workers", listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        wait_until(lambda: listener.successes() >= len(everything), 60, "every message consumed")
        time.sleep(3)  # long enough for a second, wrong, redelivery to show
    finally:
        consumer.shutdown()
    consumed = listener.consumed
    check(set(consumed) == set(everything), f"the PushConsumer consumed all {len(everything)} messages")
    check(not listener.early, f"none before its delivery time (early: {listener.early[:5]})")
    for body in everything:
        seen = consumed[body]
        if body in failing:
            check([a for (a, _, _) in seen] == [1, 2], f"{body}, failed once, came back exactly once: {seen}")
            waited = seen[1][1] - seen[0][1]
            check(waited >= 0.9, f"{body} came back after its 1 s backoff (after {waited:.2f} s)")
        else:
            check(len(seen) == 1, f"{body} was consumed once: {seen}")
    print(f"PushConsumer: {len(everything)} consumed, {len(failing)} failed once and came back once", flush=True)


def receive_one(consumer, body, invisible_s, timeout):
    """The next message with `body` (the caller sends one message at a time: there is nothing else)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for m in consumer.receive(16, invisible_s):
            if m.body.decode() == body:
                return m
    return None


def nack_and_dead_letters(config, producer):
    topic = "Nacks"
    legacy = message(topic, "level-2")
    legacy.add_property("DELAY", "2")
    sent_at = time.time()
    producer.send(legacy)
    consumer = SimpleConsumer(config, "Nackers", {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        leveled = receive_one(consumer, "level-2", 30, 15)
        waited = time.time() - sent_at
        check(leveled is not None and waited >= 5, f"legacy level 2 is handed out after its 5 s ({waited:.2f} s)")
        consumer.ack(leveled)
        producer.send(message(topic, "nack-me"))
        first = receive_one(consumer, "nack-me", 30, 10)
        check(first is not None and first.delivery_attempt == 1, "the SimpleConsumer receives the message")
        nacked_at = time.time()
        consumer.change_invisible_duration(first, 1)
        again = receive_one(consumer, "nack-me", 30, 10)
        waited = time.time() - nacked_at
        check(again is not None and again.delivery_attempt == 2, "a nacked message comes back as attempt 2")
        check(waited >= 0.9, f"not before its 1 s (after {waited:.2f} s)")
        consumer.ack(again)
        check(receive_one(consumer, "nack-me", 30, 3) is None, "acked after the nack: it comes back once only")

        poison = producer.send(message(topic, "poison"))
        attempts = []
        while (m := receive_one(consumer, "poison", 30, 5)) is not None:
            attempts.append(m.delivery_attempt)
            consumer.change_invisible_duration(m, 1)
        check(attempts == list(range(1, 17)), f"handed out 16 times, then no more: {attempts}")
    finally:
        consumer.shutdown()

    dead_topic = "%DLQ%Nackers"
    reader = SimpleConsumer(config, "Ops", {dead_topic: FilterExpression()}, await_duration=2)
    reader.startup()
    try:
        letter = receive_one(reader, "poison", 30, 10)
        check(letter is not None, f"another group reads the dead letter from {dead_topic}")
        check(letter.properties.get("DLQ_ORIGIN_TOPIC") == topic, f"it names its origin topic: {letter.properties}")
        check(letter.properties.get("DLQ_ORIGIN_MESSAGE_ID") == poison.message_id,
              "it names its origin message id")
        reader.ack(letter)
    finally:
        reader.shutdown()
    print("SimpleConsumer: a nack came back once; a poison message was dead-lettered and read", flush=True)


def fifo(config, producer):
    topic = "Ledger"
    groups = ["account-a", "account-b", "account-c"]
    for i in range(10):
        for group in groups:
            producer.send(message(topic, f"{group}/{i}", group=group))
    listener = Listener(["account-a/3", "account-c/7"])
    consumer = PushConsumer(config, "Sequencers", listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        wait_until(lambda: listener.successes() >= 30, 60, "every FIFO message consumed")
    finally:
        consumer.shutdown()
    with listener.lock:
        calls = sorted((at, body, attempt, result) for body, seen in listener.consumed.items()
                       for (attempt, at, result) in seen)
    for group in groups:
        order = [(int(body.split("/")[1]), result) for (_, body, _, result) in calls if body.startswith(group)]
        done = [i for (i, result) in order if result == ConsumeResult.SUCCESS]
        check(done == list(range(10)), f"{group}'s messages were consumed in send order: {order}")
        # Each call is for the next message not yet consumed: none overtook a failed one.
        check(all(i == len([d for (d, r) in order[:at] if r == ConsumeResult.SUCCESS])
                  for at, (i, _) in enumerate(order)), f"{group}: none overtook a failure: {order}")
    print("FIFO: 3 message groups consumed in order, past a failure each in two of them", flush=True)


def namespaces(endpoint):
    for namespace in ("shop", "bank"):
        config = ClientConfiguration(endpoint, Credentials(), namespace=namespace)
        producer = Producer(config, ("Accounts",))
        producer.startup()
        try:
            producer.send(message("Accounts", f"{namespace}-1"))
        finally:
            producer.shutdown()
    for namespace in ("shop", "bank"):
        config = ClientConfiguration(endpoint, Credentials(), namespace=namespace)
        consumer = SimpleConsumer(config, "Auditors", {"Accounts": FilterExpression()}, await_duration=2)
        consumer.startup()
        try:
            got = []
            deadline = time.time() + 10
            while time.time() < deadline and not got:
                got = consumer.receive(16, 30)
            bodies = [m.body.decode() for m in got]
            check(bodies == [f"{namespace}-1"], f"namespace {namespace} receives only its own: {bodies}")
            consumer.ack(got[0])
        finally:
            consumer.shutdown()
    print("namespaces: two namespaces' Accounts topics kept apart", flush=True)


def main(binary):
    logging.getLogger("rocketmq").setLevel(logging.ERROR)
    server = Server(binary, tempfile.mkdtemp(prefix="delaywheel-consumers-test-")).start()
    try:
        config = ClientConfiguration(server.endpoint, Credentials())
        producer = Producer(config, ("Jobs",))
        producer.startup()
        try:
            push_consumer(config, producer)
            nack_and_dead_letters(config, producer)
            fifo(config, producer)
            namespaces(server.endpoint)
        finally:
            producer.shutdown()
        check(server.stop() == 0, "the server stops cleanly")
    finally:
        if server.process.poll() is None:
            server.kill9()
    print(f"ok: {len(checks)} checks", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)

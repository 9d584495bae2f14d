"""Starting and stopping `delaywheel serve` for the client scripts."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `delaywheel serve` process on loopback ports of its own."""

    def __init__(self, binary, store_dir, grpc_port=None, http_port=None, extra_args=()):
        self.binary, self.dir, self.extra_args = binary, store_dir, list(extra_args)
        self.grpc_port = grpc_port or free_port()
        self.http_port = http_port or free_port()
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            [self.binary, "serve", "--dir", self.dir,
             "--listen", f"127.0.0.1:{self.grpc_port}", "--http", f"127.0.0.1:{self.http_port}",
             *self.extra_args],
            stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"delaywheel serve exited with {self.process.wait()} before it listened")
        started = json.loads(line)
        assert started["grpc"] == f"127.0.0.1:{self.grpc_port}", started
        return self

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.grpc_port}"

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()

    def kill9(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        """SIGTERM, and the exit code (0 when the store closed cleanly)."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def wait_until(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")

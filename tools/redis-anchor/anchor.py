"""The Redis anchor for durable puts: a private redis-server with
`appendfsync always`, 200,000 `ZADD dq <deliver_ms> <id>|<100-byte payload>`
sent as pre-encoded RESP, 1,000 per pipeline round trip, on one socket;
timed from the first send to the last reply. Prints one JSON line.

Run through tools/redis-anchor/run.sh, which installs what it needs.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import hiredis

PORT = 6391
COMMANDS = 200_000
PIPELINE = 1_000


def resp(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


def main() -> None:
    server = os.environ.get("REDIS_SERVER", "redis-server")
    with tempfile.TemporaryDirectory(prefix="redis-anchor-") as data:
        proc = subprocess.Popen(
            [server, "--port", str(PORT), "--bind", "127.0.0.1", "--dir", data, "--appendonly", "yes",
             "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        try:
            sock = None
            for _ in range(100):
                try:
                    sock = socket.create_connection(("127.0.0.1", PORT))
                    break
                except OSError:
                    time.sleep(0.05)
            if sock is None:
                sys.exit("redis-server did not start")
            payload = b"p" * 100
            now_ms = int(time.time() * 1000)
            rounds = [
                b"".join(resp(b"ZADD", b"dq", b"%d" % (now_ms + 60_000 + i), b"%d|%s" % (i, payload))
                         for i in range(start, start + PIPELINE))
                for start in range(0, COMMANDS, PIPELINE)
            ]
            reader = hiredis.Reader()
            started = time.perf_counter()
            for chunk in rounds:
                sock.sendall(chunk)
                replies = 0
                while replies < PIPELINE:
                    reader.feed(sock.recv(65536))
                    while (reply := reader.gets()) is not False:
                        if isinstance(reply, hiredis.ReplyError):
                            sys.exit(f"redis: {reply}")
                        replies += 1
            elapsed = time.perf_counter() - started
            print(json.dumps({"commands": COMMANDS, "pipeline": PIPELINE, "secs": elapsed,
                              "per_sec": COMMANDS / elapsed}))
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()

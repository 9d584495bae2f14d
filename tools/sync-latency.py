"""How long one sync of freshly appended bytes takes on this disk, as a
distribution: appends CHUNK bytes through a shared mapping of a
preallocated, zero-filled and synced file (like a commit-log segment) and
msyncs them, COUNT times back to back; prints p50, p99, p99.9 and max in ms.
The floor and the tail of a durable put's latency, without delaywheel.

Usage: python3 tools/sync-latency.py [DIR] [COUNT] [CHUNK]
"""

import mmap
import os
import sys
import tempfile
import time

FILE_LEN = 64 << 20


def main() -> None:
    where = sys.argv[1] if len(sys.argv) > 1 else "."
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    with tempfile.TemporaryDirectory(dir=where, prefix="sync-latency-") as d:
        path = os.path.join(d, "segment")
        with open(path, "wb") as f:
            zeros = b"\0" * (1 << 20)
            for _ in range(FILE_LEN >> 20):
                f.write(zeros)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, FILE_LEN)
        at, times = 0, []
        data = b"r" * chunk
        for _ in range(count):
            if at + chunk > FILE_LEN:
                at = 0
            m[at:at + chunk] = data
            started = time.perf_counter()
            m.flush(at - at % mmap.PAGESIZE, chunk + at % mmap.PAGESIZE)
            times.append((time.perf_counter() - started) * 1000)
            at += chunk
        m.close()
        os.close(fd)
    times.sort()
    q = lambda p: times[min(len(times) - 1, int(p * len(times)))]
    print(f"msync of {chunk} bytes, {count} times: p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, "
          f"p99.9 {q(0.999):.2f} ms, max {times[-1]:.2f} ms")


if __name__ == "__main__":
    main()

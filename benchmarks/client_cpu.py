"""Client API cost in CPU time: offer and poll per 32-byte message, UDP and IPC, one process.

    python benchmarks/client_cpu.py [--messages N] [--repeats R]

Counts this thread's CPU time (``time.thread_time``), not wall time, around the client calls
only (the driver's work in invoker mode is stepped outside the timed parts), so it stays
comparable on a loaded machine where the two-process benchmarks (``benchmarks.transport``,
``benchmarks.ipc``) swing by a factor of two. Prints one JSON object: the best of ``--repeats``
rounds for each figure. Only the public API is used, so the same file measures another install:
``cd /tmp && /path/to/other/venv/bin/python /path/to/benchmarks/client_cpu.py``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.testing import free_udp_port

MESSAGE = bytes(32)


def _driver(directory: str) -> Driver:
    return Driver(
        DriverConfig(threading_mode="invoker", directory=directory, write_counters_file=False)
    )


def _round(driver: Driver, pub: Any, sub: Any, messages: int) -> tuple[float, float]:
    """CPU ns per offer and per polled message over ``messages`` messages, in batches of 100."""
    received = [0]

    def handler(payload: memoryview, header: object) -> None:
        received[0] += 1

    offer_s = poll_s = 0.0
    offered = polled = 0
    deadline = time.monotonic() + 60
    while offered < messages and time.monotonic() < deadline:
        start = time.thread_time()
        for _ in range(100):
            if pub.offer(MESSAGE) > 0:
                offered += 1
        offer_s += time.thread_time() - start
        driver.do_work()
        start = time.thread_time()
        polled += sub.poll(handler, 100)
        poll_s += time.thread_time() - start
        driver.do_work()
    while polled < offered and time.monotonic() < deadline:
        driver.do_work()
        start = time.thread_time()
        polled += sub.poll(handler, 100)
        poll_s += time.thread_time() - start
    return offer_s / max(offered, 1) * 1e9, poll_s / max(polled, 1) * 1e9


def measure(media: str, messages: int, repeats: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        with _driver(d) as driver:
            if media == "ipc":
                channel = "aeron:ipc?term-length=16m"
            else:
                channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
            pub = driver.add_publication(channel, 5)  # first: an IPC subscription scans
            sub = driver.add_subscription(channel, 5)  # for it when it is made
            if not pub.wait_until_connected(10):
                raise SystemExit(f"{media}: the subscription did not connect")
            rounds = [_round(driver, pub, sub, messages) for _ in range(repeats)]
            pub.close()
            sub.close()
    return {
        f"{media}_offer_cpu_ns": round(min(r[0] for r in rounds)),
        f"{media}_poll_cpu_ns_per_msg": round(min(r[1] for r in rounds)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    for media in ("udp", "ipc"):
        result.update(measure(media, args.messages, args.repeats))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

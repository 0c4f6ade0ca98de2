"""IPC benchmark: two processes over ``aeron:ipc`` log buffer files; prints one JSON object.

    python -m benchmarks.ipc [--seconds S]

This process publishes messages of one size for ``--seconds`` as fast as the subscriber lets it
(``offer``, retried on back pressure); a child process subscribes with ``block_poll`` (whole runs
of frames, no Python call per message) and reports the bytes and frames it consumed and when the
last arrived. Rate = frames received / (last arrival - first offer), both on the system-wide
monotonic clock. 32 B messages on a 16 MiB term, 64 KiB messages on a 64 MiB term with
``mtu=65504`` (one frame per message). Drivers in invoker mode (no driver thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from aeron_spark.transport import Driver, DriverConfig

STREAM = 2001


def _driver(directory: str) -> Driver:
    return Driver(
        DriverConfig(threading_mode="invoker", directory=directory, write_counters_file=False)
    )


def child(directory: str, frame_bytes: int) -> None:
    with _driver(directory) as driver:
        sub = driver.add_subscription("aeron:ipc", STREAM)
        print(json.dumps({"ready": True}), flush=True)
        total = [0]
        first = last = 0.0

        def on_block(buffer: Any, offset: int, length: int, session_id: int, term_id: int) -> None:
            if buffer[offset + 6] != 0:  # a block of DATA frames (a PAD comes alone: not counted)
                total[0] += length

        idle_since = time.monotonic()
        while True:
            n = 0
            for image in sub.images:
                n += image.block_poll(on_block, 1 << 22)
            if n:
                last = time.monotonic()
                first = first or last
                continue
            driver.do_work()
            if total[0] and time.monotonic() - last > 1.0:
                break
            if not total[0] and time.monotonic() - idle_since > 60:
                break
            sub.wait(0.001)
        end = max((i.position for i in sub.images), default=0)
        print(
            json.dumps(
                {
                    "bytes": total[0],
                    "frames": total[0] // frame_bytes,
                    "first": first,
                    "last": last,
                    "end_position": end,
                }
            ),
            flush=True,
        )
        # frames = whole messages: every message has the same framed length here


def run(directory: str, size: int, term: str, mtu: int, seconds: float) -> dict[str, Any]:
    max_payload = mtu - 32
    frames, last = divmod(size, max_payload) if size > max_payload else (0, size)
    frame_bytes = frames * mtu + ((last + 32 + 31) & ~31)  # a message's framed length
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.ipc", "--child", directory, str(frame_bytes)],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    with _driver(directory) as driver:
        pub = driver.add_publication(f"aeron:ipc?term-length={term}|mtu={mtu}", STREAM)
        if not pub.wait_until_connected(30):
            raise SystemExit("the subscriber did not connect")
        payload = bytes(size)
        offer = pub.offer
        sent = 0
        start = time.monotonic()
        stop = start + seconds
        while True:
            for _ in range(1000):
                if offer(payload) > 0:
                    sent += 1
            if time.monotonic() >= stop:
                break
            driver.do_work()
        result = json.loads(proc.stdout.readline())
        pub.close()
    proc.wait(30)
    elapsed = result["last"] - start
    return {
        "sent": sent,
        "received": result["frames"],
        "msgs_per_s": result["frames"] / elapsed,
        "mb_per_s": result["bytes"] / elapsed / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    out: dict[str, Any] = {"load_average_at_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(dir=base) as directory:
        small = run(directory, 32, "16m", 1408, args.seconds)
        big = run(directory, 65536, "64m", 65504, args.seconds)
    out["ipc_32b_msgs_per_s"] = round(small["msgs_per_s"])
    out["ipc_32b_sent"] = small["sent"]
    out["ipc_32b_received"] = small["received"]
    out["ipc_64k_mb_per_s"] = round(big["mb_per_s"], 1)
    out["ipc_64k_msgs_per_s"] = round(big["msgs_per_s"])
    out["ipc_64k_sent"] = big["sent"]
    out["ipc_64k_received"] = big["received"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()

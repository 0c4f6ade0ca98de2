"""Transport benchmark: two processes over UDP loopback; prints one JSON object.

    python -m benchmarks.transport [--seconds S] [--pingpong-rounds N]

* Throughput (``udp_<size>_msgs_per_s`` and ``..._mb_per_s``): this process publishes messages of
  one size for ``--seconds`` as fast as flow control allows; a child process subscribes and
  reports how many messages it received and when the last one arrived. Rate = messages received /
  (last arrival - first offer); both clocks are the system-wide monotonic clock. Sizes: 32 B,
  1 KiB and 8 KiB at the default MTU (1408), 64 KiB at ``mtu=65504``.
* Ping-pong (``pingpong_p50_us``, ``pingpong_p99_us``): 32-byte messages bounced by the child on
  a second stream; round-trip times of ``--pingpong-rounds`` rounds after a warm-up.

Both sides run the driver in invoker mode (no driver thread: the application loop steps the
driver itself), with 2 MiB socket buffers. Terms are 16 MiB (default) except 64 KiB messages,
which use 64 MiB terms so a message fits (max message = term/8). Numbers depend heavily on what
else runs on the machine; the JSON includes the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from aeron_spark.transport import Driver, DriverConfig

STREAM = 1001
PONG_STREAM = 1002
SIZES = [("32b", 32, 1408), ("1k", 1024, 1408), ("8k", 8192, 1408), ("64k", 65536, 65504)]


def _driver() -> Driver:
    return Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))


# ---------------------------------------------------------------------------- child side


def child_subscribe(port_out: Any, expected_seconds: float) -> None:
    with _driver() as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0|rcv-wnd=2m", STREAM)
        _say(port=sub.local_endpoints[0][1])
        count = 0
        last = 0.0
        first = 0.0
        idle_since = time.monotonic()
        ends = [0]

        def handler(payload: memoryview, header: Any) -> None:
            # Count whole messages (END fragments), not fragments.
            if header.buffer[header.offset + 5] & 0x40:
                ends[0] += 1

        limit = 1 << 16
        deadline = time.monotonic() + expected_seconds + 60
        while time.monotonic() < deadline:
            n = sub.poll(handler, limit)
            work = d.do_work() + n
            if n:
                count = ends[0]
                last = time.monotonic()
                if not first:
                    first = last
            if work == 0:
                if count and time.monotonic() - last > 1.0:
                    break  # the publisher has stopped
                d.idle(0.001)
                if not count:
                    idle_since = time.monotonic()
        _say(
            count=count,
            first=first,
            last=last,
            idle_since=idle_since,
            counters=d.counters.snapshot(),
        )


def child_pong() -> None:
    with _driver() as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", STREAM)
        _say(port=sub.local_endpoints[0][1])
        pong_port = int(sys.stdin.readline())
        pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{pong_port}", PONG_STREAM)

        def echo(payload: memoryview, header: Any) -> None:
            while pub.offer(payload) < 0:
                d.do_work()

        deadline = time.monotonic() + 120
        last = time.monotonic()
        while time.monotonic() < deadline:
            n = sub.poll(echo, 16)
            if n:
                last = time.monotonic()
            if d.do_work() + n == 0:
                if time.monotonic() - last > 5.0 and pub.is_connected:
                    break
                d.idle(0.0005)
        _say(done=True)


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------- parent side


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.transport", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("benchmark child exited early")
    return json.loads(line)


def throughput(size: int, mtu: int, seconds: float) -> dict[str, float]:
    child = _spawn("--child", "subscribe", "--seconds", str(seconds))
    try:
        port = _read(child)["port"]
        term = "64m" if size > 16384 else "16m"
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}|mtu={mtu}|term-length={term}"
        payload = bytes(size)
        with _driver() as d:
            pub = d.add_publication(channel, STREAM)
            deadline = time.monotonic() + 30
            while not pub.is_connected:
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark subscriber never connected")
                d.do_work()
                d.idle(0.001)
            offer = pub.offer
            do_work = d.do_work
            sent = 0
            start = time.monotonic()
            stop = start + seconds
            clock = time.monotonic
            while clock() < stop:
                for _ in range(256):
                    if offer(payload) < 0:
                        break
                    sent += 1
                if do_work() == 0:
                    d.idle(0.0005)
            # Let the last messages drain to the subscriber.
            drain_until = time.monotonic() + 2.0
            while time.monotonic() < drain_until and pub.sender_position < pub.position:
                if do_work() == 0:
                    d.idle(0.001)
            report = _read(child)
            linger_until = time.monotonic() + 0.2
            while time.monotonic() < linger_until:
                do_work()
                d.idle(0.01)
    finally:
        child.kill()
        child.wait(10)
    elapsed = max(report["last"] - start, 1e-9)
    received = report["count"]
    return {
        "msgs_per_s": received / elapsed,
        "mb_per_s": received * size / elapsed / 1e6,
        "sent": sent,
        "received": received,
        "seconds": elapsed,
    }


def pingpong(rounds: int, warmup: int = 500) -> dict[str, float]:
    child = _spawn("--child", "pong")
    try:
        port = _read(child)["port"]
        with _driver() as d:
            pong = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", PONG_STREAM)
            assert child.stdin is not None
            child.stdin.write(f"{pong.local_endpoints[0][1]}\n")
            child.stdin.flush()
            pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
            deadline = time.monotonic() + 30
            while not (pub.is_connected and pong.is_connected):
                if time.monotonic() > deadline:
                    raise RuntimeError("ping-pong peers never connected")
                d.do_work()
                d.idle(0.001)
            payload = bytearray(32)
            got = [0]

            def on_pong(p: memoryview, h: Any) -> None:
                got[0] += 1

            samples: list[int] = []
            for i in range(warmup + rounds):
                got[0] = 0
                t0 = time.perf_counter_ns()
                while pub.offer(payload) < 0:
                    d.do_work()
                d.do_work()
                while got[0] == 0:
                    if pong.poll(on_pong, 1) == 0 and d.do_work() == 0:
                        d.idle(0.0002)
                if i >= warmup:
                    samples.append(time.perf_counter_ns() - t0)
    finally:
        child.kill()
        child.wait(10)
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="publishing time per size")
    parser.add_argument("--pingpong-rounds", type=int, default=5000)
    parser.add_argument("--child", choices=["subscribe", "pong"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "subscribe":
        child_subscribe(None, args.seconds)
        return
    if args.child == "pong":
        child_pong()
        return
    result: dict[str, Any] = {"load_average_at_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    details: dict[str, Any] = {}
    for name, size, mtu in SIZES:
        r = throughput(size, mtu, args.seconds)
        details[name] = r
        result[f"udp_{name}_msgs_per_s"] = round(r["msgs_per_s"])
        result[f"udp_{name}_mb_per_s"] = round(r["mb_per_s"], 1)
    p = pingpong(args.pingpong_rounds)
    result["pingpong_p50_us"] = round(p["p50_us"], 1)
    result["pingpong_p99_us"] = round(p["p99_us"], 1)
    result["details"] = details
    result["mode"] = "invoker (no driver thread), two processes, UDP loopback"
    print(json.dumps(result))


if __name__ == "__main__":
    main()

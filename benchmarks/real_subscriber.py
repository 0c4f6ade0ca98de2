"""Our publication -> the real Aeron's subscriber, against the real Aeron's publication -> the same
subscriber, in one run; prints one JSON object (issue 34 item 2).

    python -m benchmarks.real_subscriber [--messages 100000] [--max-size 20000] [--repeats 2]
        [--profile] [--no-gso-too]

Two real Java media drivers (``io.aeron:aeron-all`` from Maven Central, ``python
transport/tests/aeron_peer.py fetch``; SHARED threading, backoff idle, their defaults otherwise)
on loopback: driver B holds the subscriber (``benchmarks/aeron_java/BenchPeer.java sub``: the
Aeron client API counting every message and checking its index, not printing it as the
``basic_subscriber`` samples do), driver A the real publisher (``BenchPeer pubn``). The
contenders publish the same ``--messages`` messages of 1..``--max-size`` random bytes (the sizes
from one xorshift64 sequence, so both send the same bytes counts; fragmented above the 1408-byte
MTU, 16 MiB terms) to a new subscriber each run:

* ``ours``: this process, our driver in invoker mode (the application loop steps it), 2 MiB
  socket buffers (its default) -> Java driver B -> the subscriber;
* ``java``: Java publisher -> Java driver A -> Java driver B -> the subscriber.

Goodput = message bytes received / (last message received - first offer), both on
CLOCK_MONOTONIC. The contenders take turns (a warm-up run each, then ``--repeats`` rounds, best
kept, as ``benchmarks._timing`` does); ``ours_to_java`` is the ratio of the best goodputs.
``--profile``: the ``ours`` runs under cProfile, the top functions by own time in the JSON.
``--no-gso-too``: a third contender, ``ours_no_gso``: ours sending every datagram with its own
``sendto`` (``DriverConfig(udp_gso=False)``, as before UDP GSO), with the CPU time of each of
our runs (``*_cpu_s``: this process, user + system).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.testing import free_udp_port
from benchmarks._timing import interleaved_best
from benchmarks.lossy_link import JAVA_PEER, _aeron_peer, _Program

STREAM = 1001
MASK = (1 << 64) - 1


def sizes(count: int, max_size: int, seed: int) -> list[int]:
    """The message sizes BenchPeer ``pubn`` makes: xorshift64 from ``seed``."""
    x, out = seed & MASK, []
    for _ in range(count):
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        out.append(1 + x % max_size)
    return out


class JavaDrivers:
    """Java media drivers A (publisher side) and B (subscriber side), and the compiled peer."""

    def __init__(self, tmp: str) -> None:
        self.peer = _aeron_peer()
        reason = self.peer.unavailable_reason()
        if reason is not None:
            raise SystemExit(f"benchmarks.real_subscriber: {reason}")
        self.classes = self.peer.compile_java(JAVA_PEER.read_text(), "BenchPeer", Path(tmp))
        self.drivers: list[Any] = []
        for tag in ("bench-a", "bench-b"):
            self.drivers.append(self.peer.JavaMediaDriver(tag=tag))

    def client(self, side: int, args: list[str]) -> _Program:
        argv = self.peer.java_argv(
            "BenchPeer",
            {"aeron.dir": self.drivers[side].aeron_dir},
            classpath=[self.classes],
            args=args,
        )
        return _Program(argv, f"BenchPeer {args[0]}")

    def close(self) -> None:
        for driver in self.drivers:
            driver.close()


def _subscriber(java: JavaDrivers, count: int, timeout_s: float) -> tuple[_Program, str]:
    port = free_udp_port()
    sub = java.client(
        1, ["sub", f"aeron:udp?endpoint=127.0.0.1:{port}", str(STREAM)] + [str(timeout_s)]
    )
    sub.json_line(60)
    sub.write(f"{count}\n")
    return sub, f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=16m|mtu=1408"


def _goodput(got: dict[str, Any], start_ns: int, count: int) -> dict[str, Any]:
    if got["received"] != count or got["bad"]:
        raise RuntimeError(f"the subscriber got {got} of {count} messages")
    seconds = (got["last_ns"] - start_ns) / 1e9
    return {"mb_per_s": got["bytes"] / seconds / 1e6, "seconds": seconds, "bytes": got["bytes"]}


def run_ours(
    java: JavaDrivers, lengths: list[int], seed: int, timeout_s: float, gso: bool = True
) -> dict[str, Any]:
    count = len(lengths)
    sub, channel = _subscriber(java, count, timeout_s)
    try:
        payload = bytearray(random.Random(seed).randbytes(max(lengths)))
        view = memoryview(payload)
        config = DriverConfig(threading_mode="invoker", write_counters_file=False, udp_gso=gso)
        with Driver(config) as driver:
            pub = driver.add_publication(channel, STREAM)
            offer, do_work, idle = pub.offer, driver.do_work, driver.idle
            deadline = time.monotonic() + 30
            while not pub.is_connected:
                if time.monotonic() > deadline:
                    raise RuntimeError("the real subscriber never connected")
                if do_work() == 0:
                    idle(0.001)
            start = time.monotonic_ns()
            cpu = os.times()
            for i, size in enumerate(lengths):
                if size >= 8:
                    payload[:8] = i.to_bytes(8, "little")
                message = view[:size]
                while offer(message) <= 0:
                    if do_work() == 0:
                        idle(0.0005)
                if i % 32 == 31:
                    do_work()
            end = time.monotonic() + timeout_s
            got = None
            while got is None and time.monotonic() < end:
                # the rest of the term still goes out at the subscriber's pace: the driver
                # sleeps on its sockets (an SM wakes it), the report is only looked at
                if do_work() == 0:
                    idle(0.0005)
                    got = sub.try_json(0)
            if got is None:
                raise RuntimeError("the real subscriber did not report")
            after = os.times()
    finally:
        sub.stop()
    out = _goodput(got, start, count)
    out["cpu_s"] = after.user - cpu.user + after.system - cpu.system
    return out


def run_java(java: JavaDrivers, count: int, max_size: int, seed: int, timeout_s: float) -> dict:
    sub, channel = _subscriber(java, count, timeout_s)
    pub = None
    try:
        pub = java.client(0, ["pubn", channel, str(STREAM), str(count), str(max_size), str(seed)])
        sent = pub.json_line(timeout_s)
        got = sub.json_line(timeout_s)
    finally:
        if pub is not None:
            pub.stop()
        sub.stop()
    return _goodput(got, sent["start_ns"], count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--max-size", type=int, default=20_000, help="sizes are 1..this bytes")
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed rounds after a warm-up (0: the warm-up only)"
    )
    parser.add_argument("--seed", type=int, default=0x5EED5EED)
    parser.add_argument("--profile", action="store_true", help="cProfile our runs")
    parser.add_argument(
        "--no-gso-too",
        action="store_true",
        help="also ours without UDP GSO (DriverConfig(udp_gso=False)), in the same turns",
    )
    args = parser.parse_args(argv)
    lengths = sizes(args.messages, args.max_size, args.seed)
    timeout_s = 120.0 + args.messages / 1000
    result: dict[str, Any] = {
        "load_average_at_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "messages": args.messages,
        "max_size": args.max_size,
        "message_bytes": sum(lengths),
        "repeats": args.repeats,
    }
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "java": []}
    if args.no_gso_too:
        runs["ours_no_gso"] = []
    profile = cProfile.Profile() if args.profile else None

    def ours() -> None:
        if profile is not None:
            profile.enable()
        try:
            runs["ours"].append(run_ours(java, lengths, args.seed, timeout_s))
        finally:
            if profile is not None:
                profile.disable()

    def ours_no_gso() -> None:
        runs["ours_no_gso"].append(run_ours(java, lengths, args.seed, timeout_s, gso=False))

    def real() -> None:
        runs["java"].append(run_java(java, args.messages, args.max_size, args.seed, timeout_s))

    with tempfile.TemporaryDirectory(prefix="bench-real-sub-") as tmp:
        java = JavaDrivers(tmp)
        try:
            result["aeron_version"] = java.peer.AERON_VERSION
            contenders = {"ours": ours, "java": real}
            if args.no_gso_too:
                contenders["ours_no_gso"] = ours_no_gso
            interleaved_best(contenders, args.repeats)
        finally:
            java.close()
    for name, rs in runs.items():
        timed = rs[1:] or rs  # the warm-up run is not counted (--repeats 0: only it ran)
        result[f"{name}_mb_per_s"] = round(max(r["mb_per_s"] for r in timed), 1)
        result[f"{name}_mb_per_s_runs"] = [round(r["mb_per_s"], 1) for r in timed]
        result[f"{name}_bytes_received"] = sorted({r["bytes"] for r in rs})
        result[f"{name}_msgs_per_s"] = round(args.messages / min(r["seconds"] for r in timed))
        if "cpu_s" in timed[0]:
            result[f"{name}_cpu_s"] = [round(r["cpu_s"], 2) for r in timed]
    result["ours_to_java"] = round(result["ours_mb_per_s"] / result["java_mb_per_s"], 3)
    if args.no_gso_too:
        result["ours_no_gso_to_java"] = round(
            result["ours_no_gso_mb_per_s"] / result["java_mb_per_s"], 3
        )
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
        result["ours_profile_top_tottime"] = out.getvalue().splitlines()[:45]
    result["load_average_at_end"] = os.getloadavg()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

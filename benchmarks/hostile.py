"""A stream server's handshake latency with and without a hostile sender; prints one JSON object.

    python -m benchmarks.hostile [--connects N] [--rounds R]

A stream server runs in a child process (``connector.server.testing.server_process``). Each
round times ``--connects`` sequential connect + one-message publish + close cycles three ways,
one after the other so all see the same machine: ``quiet`` (nothing else sends), ``crafted``
(``transport/tests/hostile_peer.py`` floods the handshake port at full speed with issue 15's
crafted SETUP/DATA pair and friends) and ``images`` (the same sender with valid small SETUPs for
a new session id every time). For each: p50 / p90 / max milliseconds, failures (a cycle that
raised, e.g. a handshake timeout after ``--timeout-s``), the flood's datagrams per second, and
how much the server's ``setups_rejected`` / ``images_refused`` counters rose. Also, in this
process, ``dispatch_us_<mode>``: microseconds the receiver's dispatcher spends per flood datagram
(no sockets: the handshake's HELLO subscription limits, ``do_work`` every 64 datagrams).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aeron_spark.connector.errors import ConnectorError
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID
from aeron_spark.transport.errors import RemoteProtocolError
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest

PEER = Path(__file__).resolve().parents[1] / "transport" / "tests" / "hostile_peer.py"


def _cycles(endpoint: str, count: int, timeout_s: float) -> tuple[list[float], int]:
    times: list[float] = []
    failures = 0
    for i in range(count):
        started = time.perf_counter()
        try:
            with client_for(endpoint, timeout_s=timeout_s) as c:
                c.publish(10, [b"bench-%d" % i])
        except ConnectorError:
            failures += 1
            continue
        times.append((time.perf_counter() - started) * 1000)
    return times, failures


def _dispatch_us(mode: str, count: int = 200_000) -> float:
    spec = importlib.util.spec_from_file_location("hostile_peer", PEER)
    assert spec is not None and spec.loader is not None
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    make = peer.image_flood_datagrams if mode == "images" else peer.crafted_datagrams
    sessions = 20_000 if mode == "images" else 8
    dispatcher = ReceiveDispatcher()
    dispatcher.add(  # what the handshake server's HELLO subscription is given
        StreamInterest(
            HANDSHAKE_STREAM_ID,
            max_term_length=64 * 1024,
            max_mtu=8192,
            max_images=512,
            max_images_per_source=4,
            max_images_per_address=256,
        )
    )
    packets = [
        (memoryview(bytearray(p) + bytearray(2048)), len(p))
        for s in range(sessions)
        for p in make(HANDSHAKE_STREAM_ID, 0x0BAD0000 + s)
    ]
    source = ("127.0.0.1", 5000)
    now = 0
    done = 0
    started = time.perf_counter()
    while done < count:
        for buf, length in packets:
            now += 10_000
            try:
                dispatcher.on_datagram(buf, length, source, now, lambda d, a: None)
            except RemoteProtocolError:
                pass
            done += 1
            if done % 64 == 0:
                dispatcher.do_work(now, lambda d, a: None)
    return (time.perf_counter() - started) / done * 1e6


def _counters(endpoint: str) -> dict[str, int]:
    with client_for(endpoint, timeout_s=60) as c:
        return dict(c.stats().get("transport", {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile")
    parser.add_argument("--connects", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {"quiet": [], "crafted": [], "images": []}
    failures = dict.fromkeys(samples, 0)
    rates: dict[str, list[float]] = {"crafted": [], "images": []}
    rose: dict[str, dict[str, int]] = {"crafted": {}, "images": {}}
    with tempfile.TemporaryDirectory() as tmp, server_process(f"{tmp}/srv") as (_p, endpoint):
        host, port = endpoint.rsplit(":", 1)
        _cycles(endpoint, 3, args.timeout_s)  # warm-up
        for _ in range(args.rounds):
            times, failed = _cycles(endpoint, args.connects, args.timeout_s)
            samples["quiet"] += times
            failures["quiet"] += failed
            for mode in ("crafted", "images"):
                before = _counters(endpoint)
                sessions = "8" if mode == "crafted" else "100000"
                peer = subprocess.Popen(
                    [
                        sys.executable,
                        str(PEER),
                        host,
                        port,
                        str(HANDSHAKE_STREAM_ID),
                        "3600",
                        sessions,
                        mode,
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                try:
                    peer.stdout.readline()
                    started = time.monotonic()
                    time.sleep(0.5)
                    times, failed = _cycles(endpoint, args.connects, args.timeout_s)
                finally:
                    peer.stdin.close()
                    done: dict[str, Any] = json.loads(peer.stdout.readline() or "{}")
                    elapsed = time.monotonic() - started
                    peer.wait(30)
                samples[mode] += times
                failures[mode] += failed
                rates[mode].append(done.get("sent", 0) / elapsed)
                after = _counters(endpoint)
                for name in (
                    "setups_rejected",
                    "images_refused",
                    "images_evicted",
                    "datagrams_received",
                ):
                    rose[mode][name] = (
                        rose[mode].get(name, 0) + after.get(name, 0) - before.get(name, 0)
                    )
    result: dict[str, Any] = {
        "benchmark": "hostile",
        "connects_per_round": args.connects,
        "rounds": args.rounds,
    }
    for mode, times in samples.items():
        ordered = sorted(times) or [float("nan")]
        result[f"{mode}_connect_p50_ms"] = round(statistics.median(ordered), 1)
        result[f"{mode}_connect_p90_ms"] = round(ordered[int(0.9 * (len(ordered) - 1))], 1)
        result[f"{mode}_connect_max_ms"] = round(ordered[-1], 1)
        result[f"{mode}_failures"] = failures[mode]
        if mode in rates:
            result[f"{mode}_flood_datagrams_per_s"] = round(statistics.median(rates[mode]))
            for name, value in rose[mode].items():
                result[f"{mode}_{name}"] = value
    for mode in ("crafted", "images"):
        result[f"dispatch_us_{mode}"] = round(min(_dispatch_us(mode) for _ in range(3)), 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

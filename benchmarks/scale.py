"""Scale curves (issue 31), one JSON object: ``python -m benchmarks.scale --index``.

``--index``: the recording's position/time index at 1, 10 (and with ``--large``, 100) million
entries: the memory the server holds for it (tracemalloc peak while opening it and answering
lookups), the time to open it (a restart), a lookup's time, against the two Python lists the index
used to be (their memory measured at one million entries, then per entry).

``--sessions 16,64,256``: N sealed sessions open on one ``aeron-spark server`` (its own process,
UDP on loopback; the clients share one process and its driver): the server's CPU while every
session is idle (per session and in % of a core, over ``--idle-s``), then each session
publishing one 100-byte message a second for ``--publish-s`` (publish p50/p99, achieved
publishes/s, failures), then ``--handshakes`` new clients' connect time (p50/p99) with the N
open, and the sessions lost (expired and replaced by a reconnect) over the run. Run it with
another interpreter to measure another tree (``/work/main/.venv/bin/python -m benchmarks.scale
--sessions ...``): the server runs under the same interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from typing import Any

import numpy as np
from aeron_spark.transport.archive.fdcache import FdCache
from aeron_spark.transport.archive.timeindex import TimeIndex


def _index_file(path: str, n: int) -> None:
    arr = np.empty((n, 2), dtype="<i8")
    arr[:, 0] = np.arange(1, n + 1, dtype=np.int64) * 64
    arr[:, 1] = np.arange(n, dtype=np.int64) * 1_000_000
    arr.tofile(path)


def _lists_bytes_per_entry(n: int = 1_000_000) -> float:
    """What the lists held: two Python lists of ints (positions, times)."""
    tracemalloc.start()
    positions = [64 * (i + 1) for i in range(n)]
    times = [1_700_000_000_000_000_000 + i * 1_000_000 for i in range(n)]
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del positions, times
    return size / n


def index_curve(sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"lists_bytes_per_entry": round(_lists_bytes_per_entry(), 1)}
    directory = tempfile.mkdtemp(prefix="aeron-spark-scale-")
    try:
        path = os.path.join(directory, "index")
        rows = []
        for n in sizes:
            _index_file(path, n)
            rng = np.random.default_rng(1)
            probes = [int(p) for p in rng.integers(0, 64 * n, 2_000)]
            files = FdCache(4)
            tracemalloc.start()
            started = time.perf_counter()
            index = TimeIndex(path, files.use)
            opened = time.perf_counter() - started
            for p in probes:
                index.floor(p)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            started = time.perf_counter()  # timed without tracemalloc's cost per allocation
            for p in probes:
                index.floor(p)
            lookup = (time.perf_counter() - started) / len(probes)
            files.close()
            rows.append(
                {
                    "entries": n,
                    "held_bytes_peak": peak,
                    "held_mb_per_10m_entries": round(peak * 10_000_000 / n / 1e6, 2),
                    "lists_mb_estimate": round(out["lists_bytes_per_entry"] * n / 1e6),
                    "open_ms": round(opened * 1000, 1),
                    "random_lookup_us": round(lookup * 1e6, 2),
                }
            )
            os.unlink(path)
        out["index"] = rows
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quantile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _publish_round(clients: list[Any], seconds: float, threads: int) -> dict[str, Any]:
    """Every client publishes one message a second (spread over the second) for ``seconds``."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    n = len(clients)

    def worker(k: int) -> None:
        mine = list(range(k, n, threads))
        local: list[float] = []
        failed = 0
        for second in range(int(seconds)):
            for i in mine:
                due = start + second + i / n
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                t0 = time.perf_counter()
                try:
                    clients[i].publish(1 + i % 8, [b"p" * 100])
                except Exception:  # noqa: BLE001 - a failed publish is a figure, not an abort
                    failed += 1
                    continue
                local.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(local)
            failures[0] += failed

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(min(threads, n))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = max(time.monotonic() - start, 1e-9)
    return {
        "publishes_per_s": round(len(latencies) / elapsed, 1),
        "wanted_per_s": n,
        "publish_p50_ms": round(_quantile(latencies, 0.5) * 1000, 1),
        "publish_p99_ms": round(_quantile(latencies, 0.99) * 1000, 1),
        "publish_failures": failures[0],
    }


def sessions_curve(
    counts: list[int], idle_s: float, publish_s: float, handshakes: int, threads: int
) -> list[dict[str, Any]]:
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server.testing import server_process

    rows = []
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="aeron-spark-scale-") as tmp:
            limit = str(n + handshakes + 16)
            extra = ["--max-clients", limit, "--max-per-address", limit]
            with server_process(f"{tmp}/srv", extra) as (proc, endpoint):
                settings = ClientSettings(
                    endpoint=endpoint, encryption=True, key_store_dir=f"{tmp}/keys", timeout_s=30
                )
                row: dict[str, Any] = {"sessions": n, "load_average_1m": os.getloadavg()[0]}
                started = time.perf_counter()
                clients = [StreamClient.connect(settings) for _ in range(n)]
                row["open_all_s"] = round(time.perf_counter() - started, 1)
                try:
                    time.sleep(2.0)  # the handshakes' tails settle
                    cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
                    time.sleep(idle_s)
                    cpu = _cpu_s(proc.pid) - cpu0
                    wall = time.monotonic() - t0
                    row["idle_server_cpu_pct"] = round(100 * cpu / wall, 2)
                    row["idle_server_cpu_us_per_session_s"] = round(1e6 * cpu / wall / n, 1)
                    cpu0 = _cpu_s(proc.pid)
                    row.update(_publish_round(clients, publish_s, threads))
                    row["publish_server_cpu_pct"] = round(
                        100 * (_cpu_s(proc.pid) - cpu0) / publish_s, 1
                    )
                    times = []
                    for _ in range(handshakes):
                        t = time.perf_counter()
                        extra_client = StreamClient.connect(settings)
                        times.append(time.perf_counter() - t)
                        extra_client.close()
                    row["handshake_p50_ms"] = round(_quantile(times, 0.5) * 1000, 1)
                    row["handshake_p99_ms"] = round(_quantile(times, 0.99) * 1000, 1)
                    row["sessions_lost"] = sum(c._generation for c in clients)
                finally:
                    for c in clients:
                        c.close()
                row["server_alive"] = proc.poll() is None
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # survives a later abort
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--index", action="store_true", help="the time index curve")
    parser.add_argument("--large", action="store_true", help="also 100 million entries (1.6 GB)")
    parser.add_argument("--sessions", help="the sessions curve: counts, e.g. 16,64,256,2048")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle window (sessions)")
    parser.add_argument("--publish-s", type=float, default=10.0, help="publishing (sessions)")
    parser.add_argument("--handshakes", type=int, default=20, help="new connects (sessions)")
    parser.add_argument("--threads", type=int, default=32, help="publishing threads (sessions)")
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.sessions:
        counts = [int(c) for c in args.sessions.split(",")]
        result["sessions"] = sessions_curve(
            counts, args.idle_s, args.publish_s, args.handshakes, args.threads
        )
    if args.index or not any([args.index, args.sessions]):
        sizes = [1_000_000, 10_000_000] + ([100_000_000] if args.large else [])
        result.update(index_curve(sizes))
    result["load_average_1m_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

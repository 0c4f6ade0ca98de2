"""Scale curves (issue 31), one JSON object: ``python -m benchmarks.scale --index``.

``--message-size``: one publish of one message of 1 ... 256 MiB (``--sizes-mib``) from a client
process to an ``aeron-spark server`` process (a fresh server per size, ``--no-encryption`` over
loopback UDP, so sessions are sealed all the same): the outcome (delivered, or refused and
whether anything was sent), the time, and each side's peak RSS (``VmHWM``) in MB and over the
message's size. ``--python`` runs both processes with another interpreter (another checkout's
venv, e.g. main's, to compare); ``--term-length`` is passed to the server (servers before issue
31 have no such option).

``--index``: the recording's position/time index at 1, 10 (and with ``--large``, 100) million
entries: the memory the server holds for it (tracemalloc peak while opening it and answering
lookups), the time to open it (a restart), a lookup's time, against the two Python lists the index
used to be (their memory measured at one million entries, then per entry).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


_MESSAGE_CLIENT = r"""
import json, os, sys, time
from aeron_spark.connector.client import ClientSettings, StreamClient

def hwm_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

endpoint, size = sys.argv[1], int(sys.argv[2])
client = StreamClient.connect(ClientSettings(endpoint=endpoint, encryption=False, timeout_s=300))
client.publish(10, [b"warm"])
baseline = hwm_kib()
payload = b"\x5a" * size
out = {"client_baseline_kib": baseline}
started = time.perf_counter()
try:
    client.publish(10, [payload])
    out["outcome"] = "delivered"
except Exception as exc:
    out["outcome"] = "refused"
    out["error"] = str(exc)[:160]
out["seconds"] = round(time.perf_counter() - started, 3)
out["client_peak_kib"] = hwm_kib()
client.close()  # a session refused halfway may still hold errors for the chunks that followed
with StreamClient.connect(ClientSettings(endpoint=endpoint, encryption=False)) as other:
    out["server_bytes_received"] = other.stats()["transport"]["bytes_received"]
print(json.dumps(out))
"""


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def message_size_curve(
    sizes_mib: list[int], python: str, term_length: str | None
) -> dict[str, Any]:
    rows = []
    for size_mib in sizes_mib:
        directory = tempfile.mkdtemp(prefix="aeron-spark-scale-msg-")
        log_path = os.path.join(directory, "server.log")
        extra = ["--term-length", term_length] if term_length else []
        code = (
            "import sys; from aeron_spark.connector.server import server_main; "
            "sys.exit(server_main(sys.argv[1:]))"
        )
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [python, "-c", code, "--dir", os.path.join(directory, "d"), "--port", "0"]
                + ["--no-encryption", *extra],
                stdout=log,
                stderr=log,
            )
        try:
            endpoint = None
            deadline = time.monotonic() + 60
            while endpoint is None and time.monotonic() < deadline and server.poll() is None:
                with open(log_path) as fh:
                    for line in fh:
                        if "listening on" in line:
                            endpoint = line.split("listening on ")[1].split()[0]
                time.sleep(0.05)
            if endpoint is None:
                with open(log_path) as fh:
                    raise RuntimeError(f"the server did not start: {fh.read()[-1000:]}")
            server_baseline = _hwm_kib(server.pid)
            done = subprocess.run(
                [python, "-c", _MESSAGE_CLIENT, endpoint, str(size_mib * 1024 * 1024)],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if done.returncode != 0:
                raise RuntimeError(f"the client failed: {done.stderr[-1500:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            server_peak = _hwm_kib(server.pid)
        finally:
            server.kill()
            server.wait(30)
            shutil.rmtree(directory, ignore_errors=True)
        size = size_mib * 1024 * 1024
        client_peak = row.pop("client_peak_kib") * 1024
        client_base = row.pop("client_baseline_kib") * 1024
        rows.append(
            {
                "size_mib": size_mib,
                "outcome": row["outcome"],
                **({"error": row["error"]} if "error" in row else {}),
                "seconds": row["seconds"],
                # what the server's transport received in all (the session's control traffic
                # included): a refusal before sending leaves it at a few KB
                "server_received_mb": round(row["server_bytes_received"] / 1e6, 2),
                "client_peak_mb": round(client_peak / 1e6, 1),
                "client_peak_over_size": round(client_peak / size, 2),
                # above the client's own baseline and the payload it built
                "client_extra_over_size": round((client_peak - client_base - size) / size, 2),
                "server_peak_mb": round(server_peak * 1024 / 1e6, 1),
                "server_peak_over_size": round(server_peak * 1024 / size, 2),
                "server_extra_over_size": round((server_peak - server_baseline) * 1024 / size, 2),
            }
        )
    return {"message_size": rows, "python": python, "term_length": term_length or "default"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--index", action="store_true", help="the time index curve")
    parser.add_argument("--large", action="store_true", help="also 100 million entries (1.6 GB)")
    parser.add_argument(
        "--message-size", action="store_true", help="one message of 1 ... 256 MiB published"
    )
    parser.add_argument("--sizes-mib", default="1,4,8,16,64,256", help="--message-size's sizes")
    parser.add_argument(
        "--python", default=sys.executable, help="--message-size: the client's and server's"
    )
    parser.add_argument("--term-length", default=None, help="--message-size: the server's")
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.index or not any([args.index, args.message_size]):
        sizes = [1_000_000, 10_000_000] + ([100_000_000] if args.large else [])
        result.update(index_curve(sizes))
    if args.message_size:
        sizes_mib = [int(s) for s in args.sizes_mib.split(",")]
        result.update(message_size_curve(sizes_mib, args.python, args.term_length))
    result["load_average_1m_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Scale curves (issue 31), one JSON object: ``python -m benchmarks.scale --index``.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--index", action="store_true", help="the time index curve")
    parser.add_argument("--large", action="store_true", help="also 100 million entries (1.6 GB)")
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.index or not any([args.index]):
        sizes = [1_000_000, 10_000_000] + ([100_000_000] if args.large else [])
        result.update(index_curve(sizes))
    result["load_average_1m_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

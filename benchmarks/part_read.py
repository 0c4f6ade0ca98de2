"""Reading a staged sink part back, as the server does to check a part a task wrote locally and
again to commit it: records of mixed lengths (the local stage test's mix, 0 to 9,000 bytes) and
of one length, at two part sizes.

    python -m benchmarks.part_read [--repeats 3]

Times ``StagingStore.read_part`` over a part file laid out by ``records`` (the best of
``--repeats``, in this thread's CPU time: comparable on a loaded machine) and prints one JSON
object: seconds and MB/s per part. Records of one length come back as arrays in a few views of
each 4 MiB block; mixed ones as a list each, so their cost is per record: it should grow with
the records, not with their square.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from aeron_spark.connector.server.staging import StagingStore
from aeron_spark.connector.session.records import records


def _parts(scale: int) -> dict[str, tuple[list[bytes], list[int]]]:
    rng = random.Random(7)
    mixed = [rng.randbytes(rng.choice([0, 3, 116, 700, 9000])) for _ in range(3000 * scale)]
    equal = [b"%0116d" % i for i in range(50_000 * scale)]
    return {
        f"mixed_{len(mixed)}": (mixed, [rng.randrange(-(2**63), 2**63) for _ in mixed]),
        f"equal_{len(equal)}": (equal, list(range(len(equal)))),
    }


def _read_s(staging: StagingStore, path: str, count: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        got = sum(len(payloads) for payloads, _rvs in staging.read_part(path))
        best = min(best, time.thread_time() - started)
        assert got == count, (got, count)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    result: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        staging = StagingStore(os.path.join(tmp, "staged"))
        for scale in (1, 4):
            for name, (payloads, rvs) in _parts(scale).items():
                path = os.path.join(tmp, f"{name}.part")
                with open(path, "wb") as fh:
                    fh.writelines(records(payloads, rvs))
                seconds = _read_s(staging, path, len(payloads), args.repeats)
                size = os.path.getsize(path)
                result[name] = {
                    "bytes": size,
                    "cpu_s": round(seconds, 4),
                    "mb_per_s": round(size / seconds / 1e6, 1),
                }
        staging.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

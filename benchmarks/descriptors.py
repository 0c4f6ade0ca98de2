"""Descriptors of a stream server with many short-lived producers: ``python -m
benchmarks.descriptors`` prints one JSON object.

The server runs in its own process under ``RLIMIT_NOFILE`` ``--soft``/``--hard`` (as ``prlimit
--nofile=SOFT:HARD`` sets it); ``--producers`` sessions, ``--threads`` at a time, each connect,
publish ``--messages`` messages and close. Then one session replays every recording.

- ``soft_limit`` / ``hard_limit``: the server's limits after start (it raises soft to hard).
- ``fds_baseline`` / ``fds_peak`` / ``fds_after``: descriptors in ``/proc/<pid>/fd`` before,
  at most during, and after the producers.
- ``fds_peak_replaying``: at most while every recording is replayed (the bounded file cache).
- ``producers_per_s``: sessions connected, published and closed per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time

from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport.archive.testing import open_fds


def run(producers: int, threads: int, messages: int, soft: int, hard: int) -> dict[str, object]:
    result: dict[str, object] = {"producers": producers, "threads": threads}
    with (
        tempfile.TemporaryDirectory() as tmp,
        server_process(f"{tmp}/srv", nofile=(soft, hard)) as (proc, endpoint),
    ):
        with client_for(endpoint) as client:
            limits = client.stats()["limits"]
        result["soft_limit_at_start"] = soft
        result["soft_limit"] = limits["open_files_soft_limit"]
        result["hard_limit"] = limits["open_files_hard_limit"]
        time.sleep(0.3)
        baseline = peak = open_fds(proc.pid)
        per_thread = producers // threads
        errors: list[str] = []

        def produce() -> None:
            for _ in range(per_thread):
                try:
                    with client_for(endpoint) as c:
                        c.publish(10, [b"." * 100] * messages)
                except Exception as exc:  # noqa: BLE001 - counted in the result
                    errors.append(repr(exc))

        workers = [threading.Thread(target=produce) for _ in range(threads)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        while any(w.is_alive() for w in workers):
            peak = max(peak, open_fds(proc.pid))
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        time.sleep(1.0)
        result.update(
            fds_baseline=baseline,
            fds_peak=peak,
            fds_after=open_fds(proc.pid),
            producers_per_s=round(per_thread * threads / elapsed, 1),
            producer_errors=len(errors),
            server_alive=proc.poll() is None,
        )
        peak_replay = 0
        with client_for(endpoint) as client:
            for rec in client.list_recordings([10]):
                for _block in client.replay(
                    rec.recording_id, rec.start_position, rec.recorded_position
                ):
                    pass
                peak_replay = max(peak_replay, open_fds(proc.pid))
            result["open_files_capacity"] = client.stats()["store"]["open_files_capacity"]
        result["fds_peak_replaying"] = peak_replay
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.descriptors")
    parser.add_argument("--producers", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--soft", type=int, default=256)
    parser.add_argument("--hard", type=int, default=256)
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.producers, args.threads, args.messages, args.soft, args.hard)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

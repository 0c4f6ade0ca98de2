"""Deterministic counts of what an idle session costs (issue 31): datagrams each way per idle
session-second (status messages, heartbeats, the rest) on the server and on the client, and
wake-ups (voluntary context switches) a second of each process, beside their CPU.

``python -m benchmarks.idle_counts --sessions 512 --idle-s 8`` prints one JSON line: a server in
its own process (``server_process``), ``--sessions`` ``StreamClient``s in this one (one embedded
driver), counts taken from the server's ``stat.json`` transport counters and this process's
driver counters over ``--idle-s`` seconds after a settle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from benchmarks._proc import cpu_s, wakeups

_KEYS = (
    "datagrams_sent",
    "datagrams_received",
    "status_messages_sent",
    "status_messages_received",
    "heartbeats_sent",
    "heartbeats_received",
    "setups_sent",
    "setups_received",
)


def _server_counters(directory: str) -> tuple[float, dict[str, int]]:
    """(the snapshot's time, its transport counters) from the server's stat.json."""
    while True:
        try:
            with open(os.path.join(directory, "stat.json")) as fh:
                data = json.load(fh)
            counters = dict(data["counters"])
            counters.update(data["transport"])
            return data.get("written_at_s", 0.0), counters
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)


def _fresh_server_counters(directory: str) -> tuple[float, dict[str, int]]:
    """Wait for the next stat.json write, so the snapshot is a moment old at most."""
    path = os.path.join(directory, "stat.json")
    mtime = os.stat(path).st_mtime_ns
    deadline = time.monotonic() + 5
    while os.stat(path).st_mtime_ns == mtime and time.monotonic() < deadline:
        time.sleep(0.01)
    return time.time(), _server_counters(directory)[1]


def measure(sessions: int, idle_s: float, settle_s: float) -> dict[str, Any]:
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server.testing import server_process
    from aeron_spark.connector.session.link import shared_driver

    row: dict[str, Any] = {"sessions": sessions, "load_average_1m": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="aeron-spark-idle-") as tmp:
        extra = ["--max-clients", str(sessions + 16), "--max-per-address", str(sessions + 16)]
        with server_process(f"{tmp}/srv", extra) as (proc, endpoint):
            settings = ClientSettings(
                endpoint=endpoint, encryption=True, key_store_dir=f"{tmp}/keys", timeout_s=30
            )
            clients = [StreamClient.connect(settings) for _ in range(sessions)]
            try:
                time.sleep(settle_s)
                # a profiler attached to either process waits for this line
                print(
                    json.dumps(
                        {"phase": "idle", "server_pid": proc.pid, "client_pid": os.getpid()}
                    ),
                    file=sys.stderr,
                    flush=True,
                )
                driver = shared_driver()
                me = os.getpid()
                s0 = _fresh_server_counters(f"{tmp}/srv")
                c0 = driver.counters.snapshot(positions=False)
                cpu0 = (cpu_s(proc.pid), cpu_s(me))
                w0 = (wakeups(proc.pid), wakeups(me))
                t0 = time.monotonic()
                time.sleep(idle_s)
                s1 = _fresh_server_counters(f"{tmp}/srv")
                c1 = driver.counters.snapshot(positions=False)
                cpu1 = (cpu_s(proc.pid), cpu_s(me))
                w1 = (wakeups(proc.pid), wakeups(me))
                wall = time.monotonic() - t0
                server_wall = s1[0] - s0[0]
                per = sessions * wall
                for side, a, b, span in (
                    ("server", s0[1], s1[1], server_wall),
                    ("client", c0, c1, wall),
                ):
                    for key in _KEYS:
                        row[f"{side}_{key}_per_session_s"] = round(
                            (b.get(key, 0) - a.get(key, 0)) / sessions / span, 3
                        )
                row["server_cpu_us_per_session_s"] = round(1e6 * (cpu1[0] - cpu0[0]) / per, 1)
                row["client_cpu_us_per_session_s"] = round(1e6 * (cpu1[1] - cpu0[1]) / per, 1)
                row["server_cpu_pct"] = round(100 * (cpu1[0] - cpu0[0]) / wall, 1)
                row["client_cpu_pct"] = round(100 * (cpu1[1] - cpu0[1]) / wall, 1)
                row["server_wakeups_per_s"] = round((w1[0] - w0[0]) / wall, 1)
                row["client_wakeups_per_s"] = round((w1[1] - w0[1]) / wall, 1)
                row["server_sessions_expired"] = s1[1].get("sessions_expired")
                row["load_average_1m_after"] = os.getloadavg()[0]
            finally:
                for c in clients:
                    c.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=512)
    parser.add_argument("--idle-s", type=float, default=8.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.sessions, args.idle_s, args.settle_s)))


if __name__ == "__main__":
    main()

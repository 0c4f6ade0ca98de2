"""Python calls per idle datagram of the driver (issue 31: an idle session's cost is Python
work, ~41 us per datagram handled): a deterministic count, not a time.

``python -m benchmarks.idle_calls --sessions 256 --idle-s 10`` prints one JSON line. Two
invoker-mode drivers in this process (a "server" and a "client") hold ``--sessions`` pairs of
streams shaped as our sessions' (``benchmarks.transport``'s ``--sessions`` rig: a request
stream client -> server, a ``control-mode=dynamic`` reply stream back, ``idle-sm-interval=1s``,
``idle-heartbeat-interval=2s``), stepped on a made-up clock (20 ms steps) with nothing
published, so what they exchange is status messages and heartbeats only. Over ``--idle-s``
made-up seconds after a settle, a ``sys.setprofile`` hook counts the Python function calls
(``calls``) and the calls of C functions (``c_calls``) inside each driver's step (``do_work``
and the ``has_work``/``next_deadline_ns`` a runner asks before it sleeps), divided by the
datagrams that driver sent plus received: ``S_calls_per_datagram`` (server),
``C_calls_per_datagram`` (client). The counts depend on the code only (and on loopback
delivering a datagram before the next step reads it), not on the machine's speed or load.
``--top N`` adds each side's N most called Python functions per datagram. Beside them, from
an ``--idle-s`` window before the counted one (no hook): each driver's thread CPU time per
datagram (``S_us_per_datagram``, ``C_us_per_datagram``; a time: it varies with the load).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from benchmarks.transport import open_session_streams

MS = 1_000_000
STEP_NS = 20 * MS


def _open_sessions(server: Driver, client: Driver, k: int) -> list[Any]:
    """``k`` request streams client -> server and ``k`` reply streams back, as
    ``benchmarks.transport``'s session rig opens them; returns the publications."""
    _, requests, replies, _ = open_session_streams(server, client, k)
    return requests + replies


def _datagrams(d: Driver) -> int:
    snap = d.counters.snapshot(positions=False)
    return int(snap.get("datagrams_sent", 0)) + int(snap.get("datagrams_received", 0))


def measure(sessions: int, idle_s: int, settle_s: int, top: int) -> dict[str, Any]:
    cfg = DriverConfig(threading_mode="invoker", write_counters_file=False)
    server, client = Driver(cfg), Driver(cfg)
    out: dict[str, Any] = {"sessions": sessions, "idle_s": idle_s}
    out["load_average_1m"] = os.getloadavg()[0]
    try:
        pubs = _open_sessions(server, client, sessions)
        clock = time.monotonic_ns()
        deadline = time.monotonic() + 120
        while not all(p.is_connected for p in pubs):
            if time.monotonic() > deadline:
                raise RuntimeError("the sessions never connected")
            clock += STEP_NS
            server.do_work(clock)
            client.do_work(clock)
        for _ in range(settle_s * 1_000_000_000 // STEP_NS):  # past the first SMs/heartbeats
            clock += STEP_NS
            server.do_work(clock)
            client.do_work(clock)
        d0 = {"S": _datagrams(server), "C": _datagrams(client)}
        cpu = {"S": 0.0, "C": 0.0}
        for _ in range(idle_s * 1_000_000_000 // STEP_NS):
            clock += STEP_NS
            for name, d in (("S", server), ("C", client)):
                t0 = time.thread_time()
                d.do_work(clock)
                d.idle(0)
                cpu[name] += time.thread_time() - t0
        for name, d in (("S", server), ("C", client)):
            n = _datagrams(d) - d0[name]
            out[f"{name}_us_per_datagram"] = round(1e6 * cpu[name] / max(n, 1), 2)
        calls = {"S": Counter[Any](), "C": Counter[Any]()}
        c_calls = {"S": 0, "C": 0}
        side = ["S"]

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls[side[0]][frame.f_code] += 1
            elif event == "c_call":
                c_calls[side[0]] += 1

        d0 = {"S": _datagrams(server), "C": _datagrams(client)}
        for _ in range(idle_s * 1_000_000_000 // STEP_NS):
            clock += STEP_NS
            for name, d in (("S", server), ("C", client)):
                side[0] = name
                sys.setprofile(hook)
                try:
                    d.do_work(clock)
                    d.idle(0)  # what a runner asks before it sleeps (returns at once)
                finally:
                    sys.setprofile(None)
        d1 = {"S": _datagrams(server), "C": _datagrams(client)}
        for name in ("S", "C"):
            n = d1[name] - d0[name]
            total = sum(calls[name].values())
            out[f"{name}_datagrams_per_session_s"] = round(n / sessions / idle_s, 3)
            out[f"{name}_calls_per_datagram"] = round(total / max(n, 1), 2)
            out[f"{name}_c_calls_per_datagram"] = round(c_calls[name] / max(n, 1), 2)
            if top:
                out[f"{name}_top"] = [
                    [f"{code.co_name} {os.path.basename(code.co_filename)}", round(c / n, 3)]
                    for code, c in calls[name].most_common(top)
                ]
    finally:
        server.close()
        client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--idle-s", type=int, default=10)
    parser.add_argument("--settle-s", type=int, default=3)
    parser.add_argument("--top", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(measure(args.sessions, args.idle_s, args.settle_s, args.top)))


if __name__ == "__main__":
    main()

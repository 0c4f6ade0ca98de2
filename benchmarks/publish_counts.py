"""Deterministic counts of what a publish costs the client process (issue 31): CPU per publish on
the publishing threads and on the embedded driver's thread, voluntary context switches (sleeps
ended) per publish, the driver's datagrams and wake-ups per publish, and, with ``--calls``,
Python calls per publish on each kind of thread; with ``--strace``, system calls per publish
(``strace -f -c`` attached for the round only).

``python -m benchmarks.publish_counts --sessions 256 --publish-s 8`` prints one JSON line: a
server in its own process, ``--sessions`` ``StreamClient``s in this one (one embedded driver), each
publishing one 100-byte message a second from ``--threads`` threads, as ``benchmarks.scale``'s
round does (each session's first publish made before, unmeasured). The idle rate, measured just
before, is taken off the round's figures (``..._less_idle``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from benchmarks._syscalls import strace_start, strace_stop
from benchmarks.scale import _publish_round

_TICK = os.sysconf("SC_CLK_TCK")


def _threads() -> dict[int, tuple[str, float, int]]:
    """This process's threads: tid -> (kind, CPU seconds, voluntary context switches)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                text = fh.read()
            with open(f"/proc/self/task/{tid}/status") as fh:
                vol = next(int(x.split()[1]) for x in fh if x.startswith("voluntary_ctxt"))
        except (FileNotFoundError, StopIteration):
            continue
        name = names.get(int(tid), "")
        fields = text.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        out[int(tid)] = (_kind(name), cpu, vol)
    return out


def _kind(name: str) -> str:
    if name.startswith("aeron"):
        return "driver"
    if name.startswith("Thread-"):
        return "publishing"
    return "other"


def _snapshot() -> tuple[float, int, dict[int, tuple[str, float, int]]]:
    """The process's CPU seconds and voluntary context switches (its ended threads' too), and
    its live threads'."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, _threads()


def _by_kind(a: Any, b: Any) -> dict[str, list[float]]:
    """CPU seconds and wake-ups between two snapshots by thread kind: the threads that lived
    through both as their kind says, the rest (the publishing threads, started and ended
    between) the process's less those."""
    agg: dict[str, list[float]] = {"publishing": [b[0] - a[0], b[1] - a[1]]}
    for tid, (kind, cpu, vol) in b[2].items():
        if tid not in a[2]:
            continue
        _kind0, cpu0, vol0 = a[2][tid]
        row = agg.setdefault(kind, [0.0, 0.0])
        row[0] += cpu - cpu0
        row[1] += vol - vol0
        agg["publishing"][0] -= cpu - cpu0
        agg["publishing"][1] -= vol - vol0
    return agg


class _Calls:
    """Python calls per thread kind while ``on`` (threading.setprofile: set before the driver's
    and the publishing threads start, so each inherits it)."""

    def __init__(self) -> None:
        self.on = False
        self.counts: Counter[tuple[str, str]] = Counter()
        self.functions: Counter[tuple[str, str]] = Counter()
        self._kinds: dict[int, str] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.on and (event == "call" or event == "c_call"):
            ident = threading.get_ident()
            kind = self._kinds.get(ident)
            if kind is None:
                kind = self._kinds[ident] = _kind(threading.current_thread().name)
            self.counts[kind, event] += 1
            code = frame.f_code if event == "call" else None
            name = (
                f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_qualname}"
                if code is not None
                else getattr(arg, "__qualname__", "?")
            )
            self.functions[kind, name] += 1


def measure(
    sessions: int, publish_s: float, threads: int, calls: bool, strace: bool, idle_s: float
) -> dict[str, Any]:
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server.testing import server_process
    from aeron_spark.connector.session.link import shared_driver

    counter = _Calls() if calls else None
    if counter is not None:
        threading.setprofile(counter)
    row: dict[str, Any] = {
        "sessions": sessions,
        "threads": threads,
        "load_average_1m": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="aeron-spark-pubcounts-") as tmp:
        extra = ["--max-clients", str(sessions + 16), "--max-per-address", str(sessions + 16)]
        with server_process(f"{tmp}/srv", extra) as (_proc, endpoint):
            settings = ClientSettings(
                endpoint=endpoint, encryption=True, key_store_dir=f"{tmp}/keys", timeout_s=30
            )
            clients = [StreamClient.connect(settings) for _ in range(sessions)]
            try:
                driver = shared_driver()
                runner = driver._runners[0]
                _publish_round(clients, 1, threads)  # each session's first publish (recording)
                time.sleep(2.0)
                t0, w0 = _snapshot(), time.monotonic()
                time.sleep(idle_s)
                idle = _by_kind(t0, _snapshot())
                idle_wall = time.monotonic() - w0
                tracer = strace_start(f"{tmp}/strace") if strace else None
                c0 = driver.counters.snapshot(positions=False)
                wake0 = runner.wakeups_sent
                t0 = _snapshot()
                if counter is not None:
                    counter.on = True
                figures = _publish_round(clients, publish_s, threads)
                if counter is not None:
                    counter.on = False
                t1 = _snapshot()
                c1 = driver.counters.snapshot(positions=False)
                wake1 = runner.wakeups_sent
                syscalls = strace_stop(tracer, f"{tmp}/strace") if tracer is not None else None
                n = max(figures["publishes"], 1)
                elapsed = figures["publish_elapsed_s"]
                row.update(figures)
                used = _by_kind(t0, t1)
                total = sum(v[0] for v in used.values())
                idle_total = sum(v[0] for v in idle.values())
                row["client_cpu_pct"] = round(100 * total / elapsed, 1)
                row["client_cpu_us_per_publish"] = round(1e6 * total / n, 1)
                row["client_cpu_us_per_publish_less_idle"] = round(
                    1e6 * (total - idle_total / idle_wall * elapsed) / n, 1
                )
                for kind, (cpu, vol) in sorted(used.items()):
                    icpu, ivol = idle.get(kind, [0.0, 0.0])
                    row[f"{kind}_cpu_us_per_publish"] = round(1e6 * cpu / n, 1)
                    row[f"{kind}_cpu_us_per_publish_less_idle"] = round(
                        1e6 * (cpu - icpu / idle_wall * elapsed) / n, 1
                    )
                    row[f"{kind}_wakeups_per_publish"] = round(vol / n, 2)
                    row[f"{kind}_wakeups_per_publish_less_idle"] = round(
                        (vol - ivol / idle_wall * elapsed) / n, 2
                    )
                for key in (
                    "datagrams_sent",
                    "datagrams_received",
                    "status_messages_sent",
                    "status_messages_received",
                    "heartbeats_sent",
                    "heartbeats_received",
                ):
                    row[f"{key}_per_publish"] = round((c1.get(key, 0) - c0.get(key, 0)) / n, 2)
                row["driver_wake_bytes_per_publish"] = round((wake1 - wake0) / n, 2)
                if counter is not None:
                    for (kind, event), count in sorted(counter.counts.items()):
                        row[f"{kind}_{event}s_per_publish"] = round(count / n, 1)
                    top = {
                        f"{kind} {name}": round(count / n, 2)
                        for (kind, name), count in counter.functions.most_common()
                    }
                    print(json.dumps({"calls_per_publish": top}, indent=0), file=sys.stderr)
                if syscalls is not None:
                    for name, count in sorted(syscalls.items(), key=lambda kv: -kv[1])[:12]:
                        row[f"strace_{name}_per_publish"] = round(count / n, 2)
                row["load_average_1m_after"] = os.getloadavg()[0]
            finally:
                for c in clients:
                    c.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--publish-s", type=float, default=8.0)
    parser.add_argument("--idle-s", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=0, help="default: as benchmarks.scale")
    parser.add_argument("--calls", action="store_true", help="count Python calls (slow)")
    parser.add_argument("--strace", action="store_true", help="count system calls (slow)")
    args = parser.parse_args()
    threads = args.threads or max(32, args.sessions // 16)
    row = measure(args.sessions, args.publish_s, threads, args.calls, args.strace, args.idle_s)
    print(json.dumps(row), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()

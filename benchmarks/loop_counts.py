"""Deterministic counts of the stream server's loop (issue 31): what its thread does per idle
session-second and per publish: passes (``SessionSchedule.due`` calls), sessions served, of
those served only for their connection check, wake-ups (voluntary context switches of the
loop's thread), its CPU, and with ``--calls`` the Python calls it makes (a profile hook on
that thread alone: it slows the loop, so its CPU is not a figure then).

``python -m benchmarks.loop_counts --sessions 512 --idle-s 6 --publish-s 6`` prints one JSON
line: a ``StreamServer`` in this process, the ``--sessions`` clients in a child process (its
own driver), each publishing one 100-byte message a second in the publish phase (after a
warm-up round that makes the recordings). ``python -m benchmarks.loop_counts --sequential
300 --calls``: instead one session publishing 300 times one after the other (counts a
publish that no batching makes depend on the machine's load); ``--strace`` adds the server
process's system calls (``strace -f -c``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks._proc import cpu_s, thread_counts
from benchmarks._syscalls import strace_start, strace_stop


class _Calls:
    """Python calls (and C calls) made on the thread that installed it."""

    def __init__(self) -> None:
        self.calls = 0
        self.by: dict[str, int] = {}
        self.by_function = False

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1
            if self.by_function:
                name = frame.f_code.co_qualname if event == "call" else f"C {arg.__qualname__}"
                self.by[name] = self.by.get(name, 0) + 1

    def top(self, n: int, unit: float) -> dict[str, float]:
        """The ``n`` functions called most since the last call, per ``unit``."""
        out = sorted(self.by.items(), key=lambda kv: -kv[1])[:n]
        self.by = {}
        return {name: round(count / unit, 3) for name, count in out}


class _ThreadCalls:
    """Python calls of each thread started while :meth:`install` is in force, by thread name
    (the server's driver thread, its stat writer, ...): each thread's first profile event
    puts that thread's own :class:`_Calls` hook in place."""

    def __init__(self, by_function: bool) -> None:
        self.by_function = by_function
        self.counters: dict[str, _Calls] = {}

    def _first(self, frame: Any, event: str, arg: Any) -> None:
        name = threading.current_thread().name
        counter = self.counters.get(name)
        if counter is None:
            counter = self.counters[name] = _Calls()
            counter.by_function = self.by_function
        sys.setprofile(counter.hook)
        counter.hook(frame, event, arg)

    def install(self) -> None:
        threading.setprofile(self._first)

    def uninstall(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]

    def totals(self) -> dict[str, int]:
        return {name: counter.calls for name, counter in self.counters.items()}


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's Python threads, by name (summed over threads of a name)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.native_id is None:
            continue
        try:
            cpu, _ = thread_counts(thread.native_id)
        except OSError:  # it ended
            continue
        out[thread.name] = out.get(thread.name, 0.0) + cpu
    return out


def _start(server: Any, counter: _Calls | None) -> None:
    """Start ``server``'s loop thread, with ``counter``'s profile hook on it (that thread
    alone) when given."""
    if counter is not None:
        run = server._run

        def counted() -> None:
            sys.setprofile(counter.hook)
            run()

        server._run = counted
    server.start()


def _sequential_client(endpoint: str, key_dir: str, n: int, conn: Any) -> None:
    """One session (its own process and driver): ``n`` publishes one after the other, on the
    parent's word; then says it is done."""
    from aeron_spark.connector.client import ClientSettings, StreamClient

    settings = ClientSettings(endpoint=endpoint, encryption=True, key_store_dir=key_dir)
    client = StreamClient.connect(settings)
    try:
        client.publish(1, [b"w" * 100])  # its recording made
        conn.send("open")
        conn.recv()
        for _ in range(n):
            client.publish(1, [b"p" * 100])
        conn.send("done")
    finally:
        client.close()


def sequential(
    n: int, calls: bool, strace: bool, calls_top: int = 0, driver_threading: str = "invoker"
) -> dict[str, Any]:
    """``--sequential N``: one session publishing N times one after the other: the loop's
    passes, wake-ups, Python calls (``--calls``) and the server process's system calls
    (``--strace``) per publish, with no batching to make them depend on the load."""
    import multiprocessing

    from aeron_spark.connector.server.config import ServerConfig
    from aeron_spark.connector.server.server import StreamServer

    row: dict[str, Any] = {
        "sequential_publishes": n,
        "driver_threading": driver_threading,
        "load_average_1m": os.getloadavg()[0],
    }
    counter = _Calls()
    counter.by_function = calls_top > 0
    others = _ThreadCalls(calls_top > 0)  # the driver's thread and the rest
    with tempfile.TemporaryDirectory(prefix="aeron-spark-loop-") as tmp:
        if calls:
            others.install()
        try:
            server = StreamServer(
                ServerConfig(
                    directory=f"{tmp}/srv",
                    port=0,
                    encryption=False,
                    driver_threading=driver_threading,  # type: ignore[arg-type]
                )
            )
            _start(server, counter if calls else None)
        finally:
            others.uninstall()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_sequential_client, args=(server.endpoint, f"{tmp}/keys", n, child)
        )
        proc.start()
        try:
            if not parent.poll(120) or parent.recv() != "open":
                raise RuntimeError("the client did not open its session")
            time.sleep(0.5)
            assert server._thread is not None and server._thread.native_id is not None
            tid = server._thread.native_id
            tracer = strace_start(f"{tmp}/strace.txt") if strace else None
            counter.top(0, 1)  # the session's opening calls are not a publish's
            for each in others.counters.values():
                each.top(0, 1)
            cpu0, woken0 = thread_counts(tid)
            threads0, others0, process0 = _threads_cpu(), others.totals(), cpu_s(os.getpid())
            passes0, calls0, t0 = server.schedule.passes, counter.calls, time.monotonic()
            parent.send("go")
            if not parent.poll(600) or parent.recv() != "done":
                raise RuntimeError("the client did not finish")
            elapsed = time.monotonic() - t0
            cpu1, woken1 = thread_counts(tid)
            threads1, others1, process1 = _threads_cpu(), others.totals(), cpu_s(os.getpid())
            row["server_process_cpu_us_per_publish"] = round(1e6 * (process1 - process0) / n, 1)
            row["thread_cpu_us_per_publish"] = {
                name: round(1e6 * (cpu - threads0.get(name, 0.0)) / n, 1)
                for name, cpu in threads1.items()
                if cpu > threads0.get(name, 0.0)
            }
            row["passes_per_publish"] = round((server.schedule.passes - passes0) / n, 3)
            row["loop_wakeups_per_publish"] = round((woken1 - woken0) / n, 3)
            row["loop_cpu_us_per_publish"] = round(1e6 * (cpu1 - cpu0) / n, 1)
            if calls:
                row["loop_calls_per_publish"] = round((counter.calls - calls0) / n, 1)
                row["thread_calls_per_publish"] = {
                    name: round((count - others0.get(name, 0)) / n, 1)
                    for name, count in others1.items()
                    if count > others0.get(name, 0)
                }
                if calls_top:
                    row["top_calls_per_publish"] = counter.top(calls_top, n)
                    row["thread_top_calls_per_publish"] = {
                        name: each.top(calls_top, n) for name, each in others.counters.items()
                    }
            row["elapsed_s"] = round(elapsed, 2)
            if tracer is not None:
                counted_calls = strace_stop(tracer, f"{tmp}/strace.txt")
                row["strace_syscalls_per_publish"] = round(sum(counted_calls.values()) / n, 2)
                row["strace_per_publish"] = {
                    name: round(count / n, 2)
                    for name, count in sorted(counted_calls.items(), key=lambda kv: -kv[1])[:8]
                }
        finally:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
            server.close()
    row["load_average_1m_after"] = os.getloadavg()[0]
    return row


def measure(
    sessions: int,
    idle_s: float,
    publish_s: float,
    calls: bool,
    calls_top: int = 0,
    strace: bool = False,
    driver_threading: str = "invoker",
) -> dict[str, Any]:
    from aeron_spark.connector.server.config import ServerConfig
    from aeron_spark.connector.server.server import StreamServer
    from benchmarks.scale import _ClientProcesses

    row: dict[str, Any] = {
        "sessions": sessions,
        "driver_threading": driver_threading,
        "load_average_1m": os.getloadavg()[0],
    }
    counter = _Calls()
    counter.by_function = calls_top > 0
    others = _ThreadCalls(False)  # the driver's thread (shared mode) and the rest
    with tempfile.TemporaryDirectory(prefix="aeron-spark-loop-") as tmp:
        config = ServerConfig(
            directory=f"{tmp}/srv",
            port=0,
            encryption=False,
            max_clients=sessions + 16,
            max_per_address=sessions + 16,
            driver_threading=driver_threading,  # type: ignore[arg-type]
        )
        server = StreamServer(config)
        if calls:
            others.install()
        try:
            _start(server, counter if calls else None)
        finally:
            others.uninstall()
        spread = None
        try:
            assert server._thread is not None and server._thread.native_id is not None
            tid = server._thread.native_id
            spread = _ClientProcesses(server.endpoint, f"{tmp}/keys", sessions, 1, 128)
            time.sleep(2.0)
            schedule = server.schedule

            def take() -> tuple[Any, ...]:
                cpu, woken = thread_counts(tid)
                return (
                    time.monotonic(),
                    cpu,
                    woken,
                    schedule.passes,
                    schedule.served,
                    schedule.checks,
                    counter.calls,
                    cpu_s(os.getpid()),
                    counter.calls + sum(others.totals().values()),
                )

            def per(a: tuple[Any, ...], b: tuple[Any, ...], unit: float, prefix: str) -> None:
                names = ("loop_cpu_us", "loop_wakeups", "passes", "served", "checks", "calls")
                for i, name in enumerate(names, start=1):
                    if name == "calls" and not calls:
                        continue
                    scale = 1e6 if name == "loop_cpu_us" else 1
                    row[f"{prefix}_{name}"] = round(scale * (b[i] - a[i]) / unit, 3)
                row[f"{prefix}_server_process_cpu_us"] = round(1e6 * (b[7] - a[7]) / unit, 1)
                if calls:  # the loop's and every server thread's (the driver's in shared mode)
                    row[f"{prefix}_all_threads_calls"] = round((b[8] - a[8]) / unit, 3)

            counter.top(0, 1)  # the handshakes' calls are not the idle phase's
            a = take()
            time.sleep(idle_s)
            b = take()
            per(a, b, sessions * (b[0] - a[0]), "idle_per_session_s")
            if calls_top:
                row["idle_top_calls_per_session_s"] = counter.top(
                    calls_top, sessions * (b[0] - a[0])
                )
            row["idle_loop_cpu_pct"] = round(100 * (b[1] - a[1]) / (b[0] - a[0]), 2)
            row["idle_server_cpu_pct"] = round(100 * (b[7] - a[7]) / (b[0] - a[0]), 2)
            spread.publish_round(1, sessions, time.monotonic() + 0.5)  # warm-up: recordings
            time.sleep(2.0)
            counter.top(0, 1)
            tracer = strace_start(f"{tmp}/strace.txt") if strace else None
            a = take()
            figures, lost = spread.publish_round(publish_s, sessions, time.monotonic() + 0.5)
            b = take()
            if tracer is not None:
                # under ptrace every system call is slow: the counts, not the times, are figures
                counted = strace_stop(tracer, f"{tmp}/strace.txt")
                n = max(figures["publishes"], 1)
                row["strace_syscalls_per_publish"] = round(sum(counted.values()) / n, 2)
                row["strace_per_publish"] = {
                    name: round(count / n, 2)
                    for name, count in sorted(counted.items(), key=lambda kv: -kv[1])[:12]
                }
            idle = {k: v for k, v in row.items() if k.startswith("idle_per_session_s_")}
            publishes = max(figures["publishes"], 1)
            per(a, b, publishes, "per_publish")
            if calls_top:
                row["publish_top_calls_per_publish"] = counter.top(calls_top, publishes)
            # less what the same span would have cost idle
            span_sessions = sessions * (b[0] - a[0])
            for key, value in idle.items():
                name = key.removeprefix("idle_per_session_s_")
                row[f"per_publish_{name}_less_idle"] = round(
                    row[f"per_publish_{name}"] - value * span_sessions / publishes, 3
                )
            row.update(figures)
            row["sessions_lost"] = lost
        finally:
            if spread is not None:
                spread.close()
            server.close()
    row["load_average_1m_after"] = os.getloadavg()[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=512)
    parser.add_argument("--idle-s", type=float, default=6.0)
    parser.add_argument("--publish-s", type=float, default=6.0)
    parser.add_argument("--calls", action="store_true", help="count the loop's Python calls")
    parser.add_argument(
        "--calls-top", type=int, default=0, help="with --calls: the N functions called most"
    )
    parser.add_argument(
        "--strace", action="store_true", help="system calls a publish (strace -f -c: slow)"
    )
    parser.add_argument(
        "--driver-threading",
        choices=("invoker", "shared"),
        default="invoker",
        help="the server's ServerConfig.driver_threading (before/after in one tree)",
    )
    parser.add_argument(
        "--sequential",
        type=int,
        default=0,
        help="instead: one session publishing this many times one after the other",
    )
    args = parser.parse_args()
    if args.sequential:
        row = sequential(
            args.sequential, args.calls, args.strace, args.calls_top, args.driver_threading
        )
        print(json.dumps(row))
        return
    row = measure(
        args.sessions,
        args.idle_s,
        args.publish_s,
        args.calls,
        args.calls_top,
        args.strace,
        args.driver_threading,
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()

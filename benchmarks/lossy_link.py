"""The transport over a lossy link between two hosts; prints one JSON object.

    sudo python -m benchmarks.lossy_link [--seconds S] [--losses 0,1,5,10]
        [--sizes 32,1024,8192,65536] [--repeats N] [--window 4m] [--real-aeron]

Two hosts: this process in the root network namespace and a subscriber process in a new one,
joined by a veth pair (1,500-byte MTU) whose ends drop the given percentage of arriving IP
packets (nftables, :mod:`aeron_spark.transport.testing_netns`). For each loss rate and message
size this process publishes for ``--seconds`` as fast as flow control allows (8 MiB terms, mtu
1408, the receiver window of ``--window``; sessions use half their 8 MiB term) and waits until the
subscriber has every message, in order. Figures per case:

* ``goodput_mb_per_s``: message bytes delivered / (last delivery - first offer);
* ``vs_loss_free``: that goodput over the loss-free goodput of the same size;
* ``retransmit_overhead``: bytes retransmitted / bytes delivered;
* ``retransmitted_per_lost``: bytes retransmitted / bytes the link dropped on the way to the
  subscriber (1.0 is ideal; above 1 are duplicate retransmits);
* ``naks``: NAKs the publisher received.

With ``--real-aeron`` the real Aeron runs every case too, in the same run, over the same link
and loss, taking turns with ours: a Java media driver on each host (``io.aeron:aeron-all`` from
Maven Central, ``python transport/tests/aeron_peer.py fetch``; SHARED threading, backoff idle,
its defaults otherwise, as ours uses its own) and a small publisher / subscriber on its client API
(``benchmarks/aeron_java/BenchPeer.java``, compiled at start into a temporary directory) doing
what ours does: the same channel parameters, message sizes, seconds and in-order check. Its
figures carry a ``java_`` prefix; ``ours_to_java`` divides our goodput by the real driver's.

With ``--repeats N`` each case runs N times, interleaved, and the median goodput is kept. Needs
root, iproute2 and nftables. Numbers depend on what else runs on the machine: the JSON has the
load average at the start and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aeron_spark.transport.testing_netns import (
    STREAM_ID,
    LossyLink,
    transfer,
    unavailable_reason,
)

HERE = Path(__file__).resolve().parent
JAVA_PEER = HERE / "aeron_java" / "BenchPeer.java"


def _case(link: LossyLink, loss: float, size: int, seconds: float, window: str) -> dict[str, Any]:
    link.set_loss(loss)
    r = transfer(
        link,
        size=size,
        seconds=seconds,
        channel_params="|term-length=8m|mtu=1408",
        receiver_window=window,
        timeout_s=max(60.0, seconds * 20),
    )
    delivered = r.received * size
    return {
        "goodput_mb_per_s": round(r.goodput_mb_per_s, 2),
        "messages": r.received,
        "complete": r.received == r.offered and r.bad == 0,
        "seconds": round(r.seconds, 2),
        "retransmitted_bytes": r.retransmitted_bytes,
        "lost_bytes": r.lost_bytes,
        "lost_packets": r.dropped_to_b[0],
        "retransmit_overhead": round(r.retransmitted_bytes / delivered, 4) if delivered else None,
        "retransmitted_per_lost": (
            round(r.retransmitted_bytes / r.lost_bytes, 2) if r.lost_bytes else None
        ),
        "naks": r.publisher.get("naks_received", 0),
        "retransmits_suppressed": r.publisher.get("retransmits_suppressed", 0),
        "socket_overflows": r.overflows_b,
    }


# ------------------------------------------------------------- the real Aeron (Java) on the link


SOCKET_BUFFER = 2 * 1024 * 1024


def _size(text: str) -> int:
    """``4m``, ``512k``, ``65536``: bytes."""
    scale = {"k": 1024, "m": 1024 * 1024, "g": 1024**3}.get(text[-1:].lower(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _aeron_peer() -> Any:
    """``transport/tests/aeron_peer.py`` (the real Aeron jar, fetched with Maven)."""
    tests = HERE.parent / "transport" / "tests"
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import aeron_peer

    return aeron_peer


class _Program:
    """A process in its own process group with a stdin pipe; its JSON output lines are queued
    (other lines kept for error messages)."""

    def __init__(self, argv: list[str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._json: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    self._json.put(json.loads(line))
        self._json.put(None)

    def json_line(self, timeout_s: float) -> dict[str, Any]:
        try:
            got = self._json.get(timeout=timeout_s)
        except queue.Empty:
            got = None
        if got is None:
            raise RuntimeError(
                f"{self.name}: no report within {timeout_s} s (exit {self.proc.poll()}):\n"
                + "\n".join(self.lines[-30:])
            )
        return got

    def try_json(self, timeout_s: float) -> dict[str, Any] | None:
        """The next JSON line if one comes within ``timeout_s``, else None (raises at EOF)."""
        try:
            got = self._json.get(timeout=timeout_s) if timeout_s > 0 else self._json.get_nowait()
        except queue.Empty:
            return None
        if got is None:
            self._json.put(None)
            raise RuntimeError(
                f"{self.name} exited ({self.proc.poll()}):\n" + "\n".join(self.lines[-30:])
            )
        return got

    def write(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        for sig, wait in ((None, 5.0), (signal.SIGINT, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        self._reader.join(5)


class JavaHosts:
    """A real Java media driver on each host of ``link`` and the compiled ``BenchPeer``."""

    def __init__(self, link: LossyLink, tmp: str) -> None:
        self.peer = _aeron_peer()
        reason = self.peer.unavailable_reason()
        if reason is not None:
            raise SystemExit(f"--real-aeron: {reason}")
        self.link = link
        self.classes = self.peer.compile_java(JAVA_PEER.read_text(), "BenchPeer", Path(tmp))
        self.drivers: list[tuple[_Program, str]] = []
        self.ports = itertools.count(random.randrange(20000, 40000))
        for host in (link.a, link.b):
            aeron_dir = self.peer.new_aeron_dir("lossy")
            # ours opens its sockets with 2 MiB buffers (DriverConfig.socket_buffer_length)
            props = self.peer.driver_properties(
                aeron_dir,
                **{
                    "aeron.socket.so_sndbuf": SOCKET_BUFFER,
                    "aeron.socket.so_rcvbuf": SOCKET_BUFFER,
                },
            )
            argv = self.peer.java_argv("io.aeron.driver.MediaDriver", props)
            driver = _Program(host.command(argv), "java-media-driver")
            self.drivers.append((driver, aeron_dir))
            deadline = time.monotonic() + self.peer.DRIVER_START_S
            cnc = Path(aeron_dir) / "cnc.dat"
            while not (cnc.exists() and cnc.stat().st_size > 0):
                if driver.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "a Java media driver did not start:\n" + "\n".join(driver.lines[-30:])
                    )
                time.sleep(0.05)

    def client(self, host_index: int, args: list[str]) -> _Program:
        host = (self.link.a, self.link.b)[host_index]
        argv = self.peer.java_argv(
            "BenchPeer",
            {"aeron.dir": self.drivers[host_index][1]},
            classpath=[self.classes],
            args=args,
        )
        return _Program(host.command(argv), f"BenchPeer {args[0]}")

    def publisher_counters(self) -> dict[str, int]:
        counters, _ = self.peer.read_cnc(self.drivers[0][1])
        return dict(counters)

    def close(self) -> None:
        for driver, aeron_dir in self.drivers:
            driver.stop()
            shutil.rmtree(aeron_dir, ignore_errors=True)


@contextlib.contextmanager
def java_hosts(link: LossyLink) -> Iterator[JavaHosts]:
    with tempfile.TemporaryDirectory(prefix="bench-lossy-java-") as tmp:
        hosts = None
        try:
            hosts = JavaHosts(link, tmp)
            yield hosts
        finally:
            if hosts is not None:
                hosts.close()


def _java_case(
    java: JavaHosts, loss: float, size: int, seconds: float, window: str
) -> dict[str, Any]:
    """The real Aeron over the link: what :func:`_case` measures of ours."""
    link = java.link
    link.set_loss(loss)
    timeout_s = max(60.0, seconds * 20)
    port = next(java.ports)
    # Aeron refuses a receiver window larger than the socket's receive buffer
    rcvbuf = max(SOCKET_BUFFER, _size(window))
    sub_channel = f"aeron:udp?endpoint={link.b.address}:{port}|rcv-wnd={window}|so-rcvbuf={rcvbuf}"
    sub = java.client(1, ["sub", sub_channel, str(STREAM_ID), str(timeout_s)])
    pub = None
    try:
        sub.json_line(60)
        before_b = link.dropped(link.b)
        before = java.publisher_counters()
        channel = f"aeron:udp?endpoint={link.b.address}:{port}|term-length=8m|mtu=1408"
        pub = java.client(0, ["pub", channel, str(STREAM_ID), str(size), str(seconds)])
        sent = pub.json_line(seconds + 60)
        sub.write(f"{sent['offered']}\n")
        got = sub.json_line(timeout_s)
        after = java.publisher_counters()
        after_b = link.dropped(link.b)
    finally:
        if pub is not None:
            pub.stop()
        sub.stop()
    elapsed = (got["last_ns"] - sent["start_ns"]) / 1e9 if got["last_ns"] else 0.0
    packets, dropped = after_b[0] - before_b[0], after_b[1] - before_b[1]
    lost = dropped - 28 * packets
    resent = after.get("Retransmitted bytes", 0) - before.get("Retransmitted bytes", 0)
    return {
        "goodput_mb_per_s": round(got["bytes"] / elapsed / 1e6, 2) if elapsed > 0 else 0.0,
        "messages": got["received"],
        "complete": got["received"] == sent["offered"] and got["bad"] == 0,
        "seconds": round(elapsed, 2),
        "retransmitted_bytes": resent,
        "lost_bytes": lost,
        "lost_packets": packets,
        "retransmitted_per_lost": round(resent / lost, 2) if lost and resent else None,
        "naks": after.get("NAKs received", 0) - before.get("NAKs received", 0),
        "retransmits_sent": after.get("Retransmits sent", 0) - before.get("Retransmits sent", 0),
    }


def _medians(
    runs: dict[tuple[int, float], list[dict[str, Any]]], sizes: list[int], losses: list[float]
) -> dict[str, dict[str, Any]]:
    cases: dict[str, dict[str, Any]] = {}
    for size in sizes:
        base = None
        for loss in losses:
            rs = sorted(runs[(size, loss)], key=lambda r: r["goodput_mb_per_s"])
            median = rs[len(rs) // 2]
            median["goodput_runs"] = [r["goodput_mb_per_s"] for r in runs[(size, loss)]]
            median["complete"] = all(r["complete"] for r in rs)
            if loss == 0:
                base = median["goodput_mb_per_s"]
            if base:
                median["vs_loss_free"] = round(median["goodput_mb_per_s"] / base, 2)
            cases[f"{size}b_{loss:g}pct"] = median
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="publishing time per case")
    parser.add_argument("--losses", default="0,1,5,10", help="loss percentages, comma separated")
    parser.add_argument("--sizes", default="32,1024,8192,65536", help="message sizes in bytes")
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (median kept)")
    parser.add_argument("--window", default="4m", help="receiver window (rcv-wnd)")
    parser.add_argument(
        "--real-aeron",
        action="store_true",
        help="also run the real Aeron (Java media drivers from Maven Central) on every case",
    )
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(json.dumps({"skipped": reason}))
        return 2
    losses = [float(x) for x in args.losses.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    started = time.monotonic()
    result: dict[str, Any] = {
        "load_average_at_start": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "seconds_per_case": args.seconds,
        "repeats": args.repeats,
        "window": args.window,
        "link": "veth, 1500-byte MTU, nftables ingress drop at both ends; mtu 1408, 8 MiB terms",
    }
    runs: dict[tuple[int, float], list[dict[str, Any]]] = {}
    java_runs: dict[tuple[int, float], list[dict[str, Any]]] = {}
    with LossyLink(0) as link, contextlib.ExitStack() as stack:
        java = stack.enter_context(java_hosts(link)) if args.real_aeron else None
        if java is not None:
            result["aeron_version"] = java.peer.AERON_VERSION
        for _ in range(args.repeats):
            for size in sizes:
                for loss in losses:
                    runs.setdefault((size, loss), []).append(
                        _case(link, loss, size, args.seconds, args.window)
                    )
                    if java is not None:
                        java_runs.setdefault((size, loss), []).append(
                            _java_case(java, loss, size, args.seconds, args.window)
                        )
    cases = _medians(runs, sizes, losses)
    for name, case in cases.items():
        result[f"goodput_{name}_mb_per_s"] = case["goodput_mb_per_s"]
        if "vs_loss_free" in case:
            result[f"vs_loss_free_{name}"] = case["vs_loss_free"]
    result["cases"] = cases
    if java_runs:
        java_cases = _medians(java_runs, sizes, losses)
        for name, case in java_cases.items():
            result[f"java_goodput_{name}_mb_per_s"] = case["goodput_mb_per_s"]
            if "vs_loss_free" in case:
                result[f"java_vs_loss_free_{name}"] = case["vs_loss_free"]
            theirs = case["goodput_mb_per_s"]
            result[f"ours_to_java_{name}"] = (
                round(cases[name]["goodput_mb_per_s"] / theirs, 2) if theirs else None
            )
        result["java_cases"] = java_cases
    result["load_average_at_end"] = os.getloadavg()[0]
    result["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

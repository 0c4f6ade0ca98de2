"""System calls of this process counted by ``strace -f -c`` over a stretch of a benchmark
(``benchmarks.loop_counts --strace``, ``benchmarks.publish_counts --strace``): no library
counts another process's system calls per name, strace's summary table does."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def strace_start(out: str) -> subprocess.Popen:
    """``strace -f -c`` attached to this process (every thread) until :func:`strace_stop`."""
    proc = subprocess.Popen(
        ["strace", "-f", "-c", "-o", out, "-p", str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached to every thread
    return proc


def strace_stop(proc: subprocess.Popen, out: str) -> dict[str, int]:
    """Detach, and the calls of each system call strace counted (its ``-c`` table)."""
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    calls: dict[str, int] = {}
    with open(out) as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 5 and parts[-1] != "total" and parts[0].replace(".", "").isdigit():
                calls[parts[-1]] = int(parts[3])
    return calls

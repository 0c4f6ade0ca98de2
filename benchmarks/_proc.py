"""Process and thread CPU time and wake-ups read from ``/proc`` (Linux), for the benchmarks'
CPU-per-operation figures: a process's or one thread's user + system seconds, and its voluntary
context switches (each a sleep that ended: a wake-up)."""

from __future__ import annotations

import os


def _cpu_of_stat(path: str) -> float:
    with open(path) as fh:
        fields = fh.read().rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _voluntary_switches(path: str) -> int:
    with open(path) as fh:
        for line in fh:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    """The process's CPU seconds (user + system, all its threads)."""
    return _cpu_of_stat(f"/proc/{pid}/stat")


def wakeups(pid: int) -> int:
    """The process's threads' voluntary context switches (each a sleep that ended)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += _voluntary_switches(f"/proc/{pid}/task/{tid}/status")
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return total


def thread_counts(tid: int, pid: int | str = "self") -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of one thread (``tid``, its native id)."""
    return (
        _cpu_of_stat(f"/proc/{pid}/task/{tid}/stat"),
        _voluntary_switches(f"/proc/{pid}/task/{tid}/status"),
    )


__all__ = ["cpu_s", "thread_counts", "wakeups"]

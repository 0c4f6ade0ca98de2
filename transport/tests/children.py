"""Child processes of a test that die with the test process, even when it is SIGKILLed.

A child started in a session of its own (so a test can signal its whole group) has nothing tying
its life to the test process: a pytest run killed (a CI timeout's SIGKILL, an OOM kill) left
Java peers, a standalone Spark cluster (53 minutes, once) and Python peers running, holding
ports, CPU and /dev/shm. :func:`popen` starts each with ``PR_SET_PDEATHSIG`` (SIGKILL; ``setpriv``
sets it, then execs the child, and it survives the child's own ``exec``\\ s), from one spawner
thread living as long as the process: the signal follows the thread that forked, so a child
started from a test's short-lived thread would otherwise die with that thread.

Used by ``aeron_peer.PeerProgram``, ``spark_tests/_cluster.py`` and the multi-process transport
tests; ``test_child_orphans.py`` and ``test_aeron_peer_orphans.py`` kill a real parent.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import subprocess
import time
from typing import Any

DIE_WITH_PARENT: tuple[str, ...] = (
    ("setpriv", "--pdeathsig", "KILL", "--") if shutil.which("setpriv") is not None else ()
)
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-child-spawner")


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)`` for a child killed when this process dies."""
    return _SPAWNER.submit(subprocess.Popen, [*DIE_WITH_PARENT, *argv], **kwargs).result()


def run(argv: list[str], timeout_s: float, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, capture_output=True, timeout=timeout_s, **kwargs)`` for a child
    killed when this process dies (and, like ``subprocess.run``, when the timeout passes)."""
    proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def running(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for init)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def outliving(parent: subprocess.Popen[Any], pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """SIGKILL ``parent`` (a process that started ``pids``), then the ones of ``pids`` still
    running ``timeout_s`` later (none once they died with it)."""
    parent.send_signal(signal.SIGKILL)
    parent.wait(30)
    deadline = time.monotonic() + timeout_s
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if running(pid)]


def reap(parent: subprocess.Popen[Any], pids: list[int]) -> None:
    """After a test of :func:`outliving`, whatever happened: ``parent`` gone and its pipe
    closed, and each of ``pids`` still running killed with its process group."""
    if parent.poll() is None:
        parent.kill()
        parent.wait(30)
    if parent.stdout is not None:
        parent.stdout.close()
    for pid in pids:  # the processes the test's child started, by their ids (their groups)
        if running(pid):
            os.killpg(pid, signal.SIGKILL)

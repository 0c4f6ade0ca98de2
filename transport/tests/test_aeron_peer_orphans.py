"""Java peers die with the process that started them.

``PeerProgram`` starts each Java peer (drivers, archives, samples) in a process group of its own,
so a test's stop can signal its group: nothing tied the peer's life to the test process, and a
pytest run killed (a CI timeout's SIGKILL, an OOM kill) left every peer running, holding ports,
CPU and its /dev/shm directory. Now each is started with ``PR_SET_PDEATHSIG`` (SIGKILL), from one
long-lived spawner thread (the signal follows the thread that forked: a peer started from a
thread that then ended would die with it). A real child Python process starts a real ``java``
peer, and is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from transport.tests import aeron_peer, children

SLEEPER = """
public class Sleeper {
    public static void main(String[] args) throws Exception {
        System.out.println("ready");
        Thread.sleep(600_000);
    }
}
"""
CHILD = """
import re, sys, threading
from transport.tests.aeron_peer import PeerProgram
holder = []
# started from a thread that ends at once: the peer must outlive it (only its process counts)
t = threading.Thread(target=lambda: holder.append(PeerProgram(["java", sys.argv[1]], "sleeper")))
t.start(); t.join()
holder[0].wait_for_line(re.compile("ready"), 120)
print(holder[0].proc.pid, flush=True)
sys.stdin.read()
"""


def test_a_java_peer_dies_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    aeron_peer.require_java()
    source = tmp_path / "Sleeper.java"
    source.write_text(SLEEPER)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(source)],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        assert child.stdout is not None
        pids.append(int(child.stdout.readline()))
        time.sleep(0.5)  # the spawning thread has long ended: the peer still runs
        assert children.running(pids[0]), "the peer died with the thread that started it"
        # on main: the java process still ran, orphaned
        assert not children.outliving(child, pids), (
            f"java peer {pids[0]} outlived the process that started it"
        )
    finally:
        children.reap(child, pids)


def test_a_peer_has_a_process_group_of_its_own_in_the_runs_session() -> None:
    """A peer's process group is its own (a stop signals the JVM and what it started) and its
    session the test run's: in a session of its own, where the kernel shares CPU time out by
    session (autogroup), each JVM got as much as the whole run, whatever a parallel run's nice
    levels (root conftest.py) said, and Spark's Python workers starved."""
    peer = aeron_peer.PeerProgram(["sleep", "600"], "sleeper")
    try:
        assert os.getpgid(peer.proc.pid) == peer.proc.pid
        assert os.getsid(peer.proc.pid) == os.getsid(0)
    finally:
        peer.stop()
    assert peer.proc.returncode == -signal.SIGINT

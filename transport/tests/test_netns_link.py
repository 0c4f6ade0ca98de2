"""The test link itself (transport/testing_netns.py): loss settings across the whole range."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from aeron_spark.transport.testing_netns import LossyLink, unavailable_reason

reason = unavailable_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")


def _send_udp(link: LossyLink, count: int) -> None:
    """``count`` UDP datagrams from host ``a`` (this namespace) to host ``b``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for i in range(count):
            sock.sendto(i.to_bytes(4, "big"), (link.b.address, 9))


def test_loss_100_drops_every_packet_and_loss_0_none() -> None:
    """``set_loss(100)`` used to fail (``numgen random mod 10000 < 10000``: nft's value range is
    0..9999); 100 % is a cut link (a partition), every IP packet dropped and counted."""
    with LossyLink(loss_percent=0) as link:
        link.set_loss(100)
        _send_udp(link, 20)
        assert link.dropped(link.b)[0] == 20
        link.set_loss(0)
        _send_udp(link, 20)
        assert link.dropped(link.b)[0] == 0
        link.set_loss(99.99)  # the largest fraction the random rule still takes
        assert link.loss_percent == 99.99


# A process holding a link: prints its tag once the link is up, then waits to be killed.
_HOLDER = """
import sys, time
from aeron_spark.transport.testing_netns import LossyLink
with LossyLink(loss_percent=1, both_namespaced=sys.argv[1] == "1") as link:
    print(link.tag, flush=True)
    time.sleep(600)
"""


def _left_of(tag: str) -> list[str]:
    """What a link tagged ``tag`` built that is still there: namespaces, root veth, tables."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    left = [w for w in names.split() if w in (f"asa{tag}", f"asb{tag}")]
    left += [w.rstrip(":").split("@")[0] for w in links.split() if w.startswith(f"asa{tag}"[:15])]
    left += [w for w in tables.split() if w == f"asloss{tag}"]
    return left


def _remove(tag: str) -> None:
    for argv in (
        ["ip", "netns", "del", f"asa{tag}"],
        ["ip", "netns", "del", f"asb{tag}"],
        ["ip", "link", "del", f"asa{tag}"[:15]],
        ["nft", "delete", "table", "netdev", f"asloss{tag}"],
    ):
        subprocess.run(argv, capture_output=True)


@pytest.mark.parametrize("both_namespaced", [False, True])
def test_a_killed_process_leaves_no_namespace_veth_or_table(both_namespaced: bool) -> None:
    """A process holding a LossyLink killed with SIGKILL (a CI timeout, a kill -9) left its
    namespace, its veth end in the caller's namespace and its nftables table for good (main:
    still there); a guard process removes them once the holder is gone."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, "1" if both_namespaced else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    tag = ""
    try:
        assert holder.stdout is not None
        tag = holder.stdout.readline().strip()
        assert tag and _left_of(tag)  # built
        holder.kill()
        holder.wait(30)
        deadline = time.monotonic() + 60  # a loaded 2-core machine
        while _left_of(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _left_of(tag) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
        if tag:
            _remove(tag)  # whatever main left


def test_building_a_link_sweeps_what_a_killed_holder_and_guard_left() -> None:
    """A holder killed with its guard (both SIGKILLed) leaves its link; the next link built
    removes it (its pid is dead)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, "0"], stdout=subprocess.PIPE, text=True
    )
    tag = ""
    try:
        assert holder.stdout is not None
        tag = holder.stdout.readline().strip()
        guards = subprocess.run(
            ["pgrep", "-f", f"asloss{tag}"], capture_output=True, text=True
        ).stdout.split()
        assert guards, "no guard process found"
        for pid in guards:
            os.kill(int(pid), signal.SIGKILL)
        holder.kill()
        holder.wait(30)
        assert _left_of(tag)  # its guard was killed first: nothing removed it
        with LossyLink(loss_percent=0):
            assert _left_of(tag) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
        if tag:
            _remove(tag)


# A holder that forks a child (no exec: multiprocessing's fork, a test's os.fork) which
# outlives it; prints its tag and the child's pid once the link is up, then waits to be killed.
_FORKING_HOLDER = """
import os, time
from aeron_spark.transport.testing_netns import LossyLink
with LossyLink(loss_percent=1) as link:
    child = os.fork()
    if child == 0:
        time.sleep(300)
        os._exit(0)
    print(link.tag, child, link._guard.pid, flush=True)
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    """``pid`` is a process that has not exited (a zombie not yet reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_child_does_not_keep_the_guard_from_firing() -> None:
    """The guard fires at end of file on its pipe from the holder; a child the holder forked
    inherited the pipe's write end (close-on-exec does nothing without an exec), so with the
    holder killed and the child alive the link stayed for as long as the child lived (main:
    still there after the bound). The write end is now closed in every forked child."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _FORKING_HOLDER], stdout=subprocess.PIPE, text=True
    )
    tag, child = "", 0
    try:
        assert holder.stdout is not None
        tag, pid, guard_pid = holder.stdout.readline().split()
        child, guard = int(pid), int(guard_pid)
        assert _left_of(tag) and _running(guard)  # built, guarded
        holder.kill()
        holder.wait(30)
        # the guard's own end, not the link's: another test's link built meanwhile sweeps the
        # links of dead holders (this one's too) whether or not the guard fired
        deadline = time.monotonic() + 60  # a loaded 2-core machine
        while _running(guard) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(child)  # the child still lives, and did not keep the guard waiting
        assert not _running(guard), "the guard still waits: the forked child holds its pipe"
        assert _left_of(tag) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        if tag:
            _remove(tag)  # whatever main left

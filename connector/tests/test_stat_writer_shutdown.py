"""A stat writer stopped while its write is still under way publishes nothing afterwards.

``SnapshotWriter.close`` waited up to 10 s for the writer's thread, then removed the files and
returned (the server then released its directory's lock) whether the thread had stopped or not.
A write still under way then (a slow disk, a large recordings list) went on and renamed its
files into the directory after the server had stopped: a ``stat.json`` naming a stopped server
(``aeron-spark stat`` reports it running until it ages), or over the ``stat.json`` of a server
started since in the same directory. Now a write that reaches its rename after ``close`` drops
its temporary file instead: nothing is left behind, nothing half-written. Real files: the write
is slow because it is large (hundreds of MB to the disk), not because of a stub.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from aeron_spark.connector.server.stat import SnapshotWriter

#: large enough that writing it takes a while at any load (the window the test closes in)
BIG = 96 * 1024 * 1024


def test_a_write_still_under_way_at_close_leaves_nothing_behind(tmp_path: Path) -> None:
    directory = tmp_path / "srv"
    directory.mkdir()
    writer = SnapshotWriter(str(directory))
    recordings = "[" + " " * BIG + "]"  # a (valid) huge recordings list
    writer.submit({"server": {"pid": os.getpid()}}, recordings)
    deadline = time.monotonic() + 60.0
    while not any(n.endswith(".tmp") for n in os.listdir(directory)):  # the write has begun
        assert time.monotonic() < deadline, "the writer never began its write"
        time.sleep(0.001)
    started = time.monotonic()
    writer.close(timeout_s=0.0)  # gives up on the thread at once: the write is under way
    took = time.monotonic() - started
    thread = writer._thread
    assert isinstance(thread, threading.Thread)
    thread.join(120.0)
    assert not thread.is_alive(), "the writer's thread did not end"
    left = sorted(os.listdir(directory))
    print(f"close took {took:.3f} s; the directory after the write ended: {left}")
    assert left == [], f"files written after close (the server had stopped): {left}"
    assert took < 5.0, f"close waited {took:.1f} s with a timeout of 0"


def test_a_write_that_ends_in_time_is_removed_with_the_rest(tmp_path: Path) -> None:
    """The usual stop: the write finishes within the timeout, then both files are removed."""
    directory = tmp_path / "srv"
    directory.mkdir()
    writer = SnapshotWriter(str(directory))
    writer.submit({"server": {"pid": os.getpid()}}, "[]")
    deadline = time.monotonic() + 60.0
    while writer.rewrites == 0:
        assert time.monotonic() < deadline, "the writer never wrote"
        time.sleep(0.01)
    assert sorted(os.listdir(directory)) == ["stat-recordings.json", "stat.json"]
    writer.close(timeout_s=30.0)
    assert os.listdir(directory) == []
    assert writer.failures == 0

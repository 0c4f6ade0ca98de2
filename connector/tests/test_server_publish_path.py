"""What one publish costs the stream server, held by counts (issue 31 item 1: 2,048 sessions
each publishing a message a second; the figures are in README's performance table).

- A publish of one small message is three writes (the frames, their index entry, the acknowledged
  end: three files, so no ``pwritev`` joins them) and nothing else: no open, no stat, once the
  recording's files are open.
- A session's first publish (its recording made from a ready spare recording directory) costs
  the loop one rename and one write more than any publish: the spare's files were opened, and
  its descriptor file made, by the spares' thread. It made five names (the directory, the
  descriptor's temporary file, its rename) and opened four files on the loop, each system call
  a chance for the driver's thread to take the GIL: 2,048 sessions publishing a first time in
  one second backed every session's publishes up for five seconds (issue 31).
- The server's loop reads a session's request with one poll of its transport: it polled again
  after every request (finding nothing, then checking the connection's liveness), although what
  arrives after a poll signals the session for the next pass anyway.
"""

from __future__ import annotations

import builtins
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.handshake.connection import Connection


def test_a_small_publish_is_three_writes_and_no_open_or_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArchiveStore(ServerConfig(directory=str(tmp_path)), None)
    try:
        ticks = itertools.count(time.time_ns(), 1_000_000_000)  # a second apart: each indexed
        store.clock = lambda: next(ticks)
        publisher = store.open_publisher(3, "session:test", 0)
        publisher.publish([b"first"], None, 0)  # opens the recording's files
        calls: dict[str, int] = {"pwrite": 0, "pwritev": 0, "open": 0, "stat": 0}

        me = threading.get_ident()  # not the descriptor's fsync on the meta-sync thread

        def counted(name: str, real: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                calls[name] += threading.get_ident() == me
                return real(*args, **kwargs)

            return call

        for name in calls:
            monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
        ends = [publisher.publish([b"p" * 100], None, 0) for _ in range(10)]
        monkeypatch.undo()
        assert calls == {"pwrite": 30, "pwritev": 0, "open": 0, "stat": 0}, calls
        assert ends == sorted(set(ends))  # each publish appended
        rec = store.recordings.get(publisher.recording_id)
        assert len(rec.index) == 11  # every publish indexed (a second apart)
    finally:
        store.close()


def test_a_first_publish_from_a_spare_opens_no_file_and_makes_no_name_but_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArchiveStore(ServerConfig(directory=str(tmp_path)), None)
    try:
        store.expect_publishers(1)
        deadline = time.monotonic() + 60  # a loaded 2-core machine: the thread may wait
        while store.recordings.spares.ready < 1:
            assert time.monotonic() < deadline, "no spare recording directory was made"
            time.sleep(0.02)
        store.expect_publishers(0)  # nothing made meanwhile on any thread
        names = ("open", "rename", "replace", "mkdir", "close", "fsync", "stat", "pwrite")
        calls: dict[str, int] = dict.fromkeys((*names, "builtins.open"), 0)
        me = threading.get_ident()  # not the spares' or the descriptor's fsync thread

        def counted(name: str, real: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                calls[name] += threading.get_ident() == me
                return real(*args, **kwargs)

            return call

        for name in names:
            monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
        monkeypatch.setattr(builtins, "open", counted("builtins.open", builtins.open))
        publisher = store.open_publisher(3, "session:test", 0)
        end = publisher.publish([b"first"], None, 0)
        monkeypatch.undo()
        # the descriptor's write, the rename, the acknowledged start (a publisher's opening),
        # then the publish's three writes (frames, index entry, acknowledged end); main: four
        # opens (the descriptor's temporary file and the three data files) and its replace too
        expected = dict.fromkeys(calls, 0) | {"rename": 1, "pwrite": 5}
        assert calls == expected, calls
        rec = store.recordings.get(publisher.recording_id)
        assert rec.recorded_position == end > 0
        assert store.recordings.files.stats()["file_opens"] == 0  # all three adopted open
    finally:
        store.close()
    again = ArchiveStore(ServerConfig(directory=str(tmp_path)), None)  # recovered as written
    try:
        [info] = again.list_recordings({3})
        assert info["recorded_position"] == end and info["source"] == "session:test"
    finally:
        again.close()


def test_the_loop_reads_a_request_with_one_poll_of_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each poll of a session's connection on the server's loop, by pass: a poll that finds
    nothing right after a poll that read, in the same pass, is the wasted one (main: one a
    request)."""
    passes = itertools.count()
    current = {"pass": -1}
    polls: list[tuple[int, int, int]] = []  # (pass, connection, fragments read)
    real_serve = StreamServer._serve_sessions
    real_poll = Connection.poll_frames

    def serve(self: StreamServer, now_ns: int, wall_ns: int) -> int:
        current["pass"] = next(passes)
        return real_serve(self, now_ns, wall_ns)

    def poll(self: Connection, fragment_limit: int = 64) -> int:
        count = real_poll(self, fragment_limit)
        if threading.current_thread().name == "aeron-spark-server":
            polls.append((current["pass"], id(self), count))
        return count

    monkeypatch.setattr(StreamServer, "_serve_sessions", serve)
    monkeypatch.setattr(Connection, "poll_frames", poll)
    config = ServerConfig(directory=str(tmp_path / "srv"), port=0, term_length=1 << 20)
    with StreamServer(config).start() as server:
        settings = ClientSettings(
            endpoint=server.endpoint, key_store_dir=str(tmp_path / "keys"), timeout_s=60
        )
        with StreamClient.connect(settings) as client:
            client.publish(5, [b"warm"])
            start = len(polls)
            for i in range(20):
                client.publish(5, [b"m%d" % i])
            taken = polls[start:]
    reads = [p for p in taken if p[2] > 0]
    assert len(reads) >= 20  # every request was read by a poll on the loop
    read_in = {(p[0], p[1]) for p in reads}
    wasted = [p for p in taken if p[2] == 0 and (p[0], p[1]) in read_in]
    assert wasted == [], f"{len(wasted)} polls after a read in the same pass"

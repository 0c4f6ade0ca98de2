"""Spare recording directories (issue 31 item 1): a stream server creating a recording made five
names on its loop (~1.2 ms of file-system CPU on the project's machine, for every session's first
publish); now a thread keeps empty directories ready and a creation renames one in. Held by
counts: the new recording's files are the spare's (same inodes: nothing was made on the
creating thread), a restart keeps whole spares and removes half-made ones, spares are never
recordings, and a server keeps one ready per session that has not published yet."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport.archive import RecordingStore
from aeron_spark.transport.archive import recordings as recordings_mod
from aeron_spark.transport.archive.spares import FILES, PREFIX, SEGMENT_0
from aeron_spark.transport.protocol.logbuffer import LogGeometry

TERM = 64 * 1024
DEADLINE_S = 60.0  # a loaded 2-core machine: the spares' thread may wait for a core


def _wait_ready(store: RecordingStore, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while store.spares.ready < count:
        assert time.monotonic() < deadline, f"{store.spares.ready} of {count} spares made"
        time.sleep(0.02)


def _inodes(directory: str) -> dict[str, int]:
    out = {".": os.stat(directory).st_ino}
    for name in os.listdir(directory):
        out[name] = os.stat(os.path.join(directory, name)).st_ino
    return out


def _spares(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(PREFIX))


def _record(store: RecordingStore, session_id: int, count: int) -> tuple[int, int, str]:
    rec = store.create(10, session_id, "session:test", 0, 0, 0, TERM, 1408, time.time_ns())
    rec.acknowledge(rec.recorded_position)  # as a publisher does when it opens
    framer = Framer(LogGeometry(TERM, 1408, 0), session_id, 10, 0)
    for position, block in framer.frame([b"m" * 100] * count, None):
        rec.append(block, position, time.time_ns())
    rec.acknowledge(rec.recorded_position)
    return rec.d.recording_id, rec.recorded_position, rec.directory


def test_a_recording_made_from_a_spare_is_the_spares_files(tmp_path: Path) -> None:
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        store.spares.want(2)
        _wait_ready(store, 2)
        before = {name: _inodes(os.path.join(store.root, name)) for name in _spares(store.root)}
        assert len(before) == 2
        for files in before.values():
            assert sorted(files) == sorted([".", *FILES])
        store.spares.want(0)  # none made after this: the counts below are exact
        rid, end, directory = _record(store, 1, 3)
        assert end == 3 * 160
        after = _inodes(directory)
        # every name of the new recording is a spare's inode: the directory, the acked, index
        # and segment files, and the descriptor (written into the spare before its rename)
        used = next(files for files in before.values() if files["."] == after["."])
        assert sorted(after) == sorted([".", "meta.msgpack", "acked", "index", SEGMENT_0])
        for name in ("meta.msgpack", "acked", "index", SEGMENT_0):
            assert after[name] == used[name], name
        assert store.spares.taken == 1
        assert store.get(rid).recorded_position == end
        assert list(store.recordings) == [rid]  # the other spare is no recording
    finally:
        store.close(time.time_ns())
    again = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert list(again.recordings) == [rid]
        rec = again.get(rid)
        assert rec.recorded_position == end and rec.has_acked_end
        assert again.spares.ready == 1  # the spare left is kept for the next creation
        assert len(rec.index) == 1
    finally:
        again.close(time.time_ns())


def test_a_restart_keeps_whole_spares_and_removes_half_made_ones(tmp_path: Path) -> None:
    root = tmp_path / "recordings"
    whole, partial, written = root / f"{PREFIX}9", root / f"{PREFIX}7", root / f"{PREFIX}8"
    for spare in (whole, partial, written):
        spare.mkdir(parents=True)
    for name in FILES:
        (whole / name).touch()
        (written / name).touch()
    (partial / "acked").touch()  # a crash while it was made
    (written / "index").write_bytes(b"x" * 16)  # not empty: not a spare the pool made
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert _spares(store.root) == [f"{PREFIX}9"]
        assert store.spares.ready == 1 and store.spares.removed == 2
        assert store.recordings == {}
        store.spares.want(2)
        _wait_ready(store, 2)
        assert _spares(store.root) == [f"{PREFIX}10", f"{PREFIX}9"]  # numbered on from 9
        store.spares.want(0)
        # the creations take them (a third is made as the creating thread's, as before)
        made = [_record(store, s, 2) for s in (1, 2, 3)]
        assert [m[0] for m in made] == [0, 1, 2]
        assert store.spares.taken == 2
    finally:
        store.close(time.time_ns())
    again = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert sorted(again.recordings) == [0, 1, 2]
        assert all(again.get(m[0]).recorded_position == m[1] for m in made)
    finally:
        again.close(time.time_ns())


def test_a_server_keeps_a_spare_for_each_session_that_has_not_published(tmp_path: Path) -> None:
    directory = str(tmp_path / "srv")
    with server_process(directory) as (_proc, endpoint):
        clients = [client_for(endpoint, timeout_s=60) for _ in range(3)]
        try:
            deadline = time.monotonic() + DEADLINE_S
            while clients[0].stats()["store"]["spare_recordings_ready"] < 3:
                assert time.monotonic() < deadline, "the spares were not made"
                time.sleep(0.05)
            for i, c in enumerate(clients):
                c.publish(5, [b"first"])
                c.publish(6 + i, [b"second stream"])  # a session's second recording: no spare
            store = clients[0].stats()["store"]
            assert store["spare_recordings_taken"] >= 3
            assert store["spare_recordings_failures"] == 0
            assert len(clients[0].list_recordings(None)) == 6
        finally:
            for c in clients:
                c.close()


def test_with_fsync_adopted_spares_are_fsynced_before_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spares a run without ``--fsync`` made may not have durable names: a store with fsync
    fsyncs each one it keeps at start (a recording made from it could lose its segment's name
    in a power cut otherwise)."""
    root = tmp_path / "recordings"
    for n in (3, 4):
        (root / f"{PREFIX}{n}").mkdir(parents=True)
        for name in FILES:
            (root / f"{PREFIX}{n}" / name).touch()
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = RecordingStore(str(tmp_path), fsync=True)
    try:
        assert store.spares.ready == 2
        for n in (3, 4):
            assert os.path.realpath(root / f"{PREFIX}{n}") in synced
    finally:
        store.close(time.time_ns())


def test_the_id_mark_is_advanced_ahead_by_the_spares_thread_not_the_creating_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The durable mark of recording ids (``next_id.msgpack``: written whole, renamed in, two
    fsyncs) was advanced on the creating thread every ``ID_BLOCK`` creations: 2,048 sessions
    publishing a first time in one second had the server's loop write and fsync it eight times
    in that second. The spares' thread keeps it ahead of the ids the wanted spares will take."""
    monkeypatch.setattr(recordings_mod, "ID_BLOCK", 4)  # the mark due at the fifth creation
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        store.spares.want(12)
        _wait_ready(store, 12)
        me = threading.get_ident()
        writes: list[str] = []
        real_replace = os.replace

        def replace(src: str, dst: str) -> None:
            if threading.get_ident() == me:
                writes.append(os.path.basename(dst))
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        ids = [_record(store, s, 1)[0] for s in range(12)]
        monkeypatch.setattr(os, "replace", real_replace)
        assert ids == list(range(12))
        # main: ['next_id.msgpack', 'next_id.msgpack'] (at the 5th and the 9th) beside each
        # descriptor's
        assert "next_id.msgpack" not in writes, writes
        assert store.spares.taken == 12
    finally:
        store.close(time.time_ns())
    again = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert sorted(again.recordings) == list(range(12))
        assert _record(again, 99, 1)[0] >= 12  # no id issued twice
    finally:
        again.close(time.time_ns())


def _fds_under(root: str) -> int:
    """This process's descriptors open on files under ``root``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(root + os.sep)
        except OSError:  # the listing's own descriptor, closed since
            pass
    return count


def test_spares_hold_their_files_open_within_a_budget_and_close_them_all(tmp_path: Path) -> None:
    """A spare holds its four files open (a creation then opens none on its thread), at most
    ``max_open_files`` descriptors for all spares: past that a spare is made closed, and opened
    by the thread when a taken one frees its share (or by the creating thread, as before, if
    it is taken first). Nothing stays open after the store is closed."""
    root = os.path.realpath(tmp_path)
    store = RecordingStore(root, fsync=False, max_open_files=8)  # 2 spares' worth
    try:
        store.spares.want(5)
        _wait_ready(store, 5)
        assert store.spares.open_files == 8 and _fds_under(root) == 8
        store.spares.want(0)
        made = [_record(store, s, 2) for s in (1, 2)]  # the two open ones
        assert store.spares.taken_open == 2
        deadline = time.monotonic() + DEADLINE_S
        while store.spares.open_files < 8:  # two of the three closed ones opened by the thread
            assert time.monotonic() < deadline, store.spares.stats()
            time.sleep(0.02)
        made += [_record(store, s, 2) for s in (3, 4, 5)]  # two open, the last one closed
        assert store.spares.taken == 5 and store.spares.taken_open == 4
        assert store.spares.open_files == 0
    finally:
        store.close(time.time_ns())
    assert _fds_under(root) == 0
    again = RecordingStore(root, fsync=False)
    try:
        assert sorted(again.recordings) == [m[0] for m in made]
        assert all(again.get(m[0]).recorded_position == m[1] for m in made)
    finally:
        again.close(time.time_ns())
    assert _fds_under(root) == 0

"""Attack: recording ids were reused. ``RecordingStore`` issued the next id as one past the
highest recording directory it found at start; when the newest recording's directory was deleted
whole (an operator cleaning up, a purge of the newest), the next recording made after a restart
got the deleted one's id, and everything keyed by recording id applied to a different recording:
a consumer's committed position (``consumers.msgpack``, which retention purges below), a sink's
commit log, a replay in flight. Fixed: the store keeps a durable high-water mark of issued ids
(``recordings/next_id.msgpack``, written whole, renamed in and its directory fsynced before an id
past it is used); a restart starts past it.

Over a real server process, real sessions and real files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import server_process
from aeron_spark.transport.archive.errors import ArchiveErrorCode, IdMarkCorruptError
from aeron_spark.transport.archive.recordings import ID_MARK_FILE, RecordingStore

TIMEOUT_S = 60.0


def _client(endpoint: str) -> StreamClient:
    return StreamClient.connect(
        ClientSettings(endpoint=endpoint, encryption=False, timeout_s=TIMEOUT_S)
    )


def test_attack_a_deleted_newest_recordings_id_is_not_issued_again(tmp_path: Path) -> None:
    directory = tmp_path / "srv"
    with server_process(str(directory)) as (_proc, endpoint), _client(endpoint) as c:
        c.publish(10, [b"ten-%d" % i for i in range(4)])
        end11 = c.publish(11, [b"eleven-%d" % i for i in range(8)])
        old = {r.recording_id: r.stream_id for r in c.list_recordings()}
        newest = max(old)
        assert old[newest] == 11, old
        c.consumer_commit("q", [11], {newest: end11})
    shutil.rmtree(directory / "recordings" / str(newest))  # the newest recording, whole

    with server_process(str(directory)) as (_proc, endpoint), _client(endpoint) as c:
        c.publish(12, [b"twelve"])
        now = {r.recording_id: r.stream_id for r in c.list_recordings()}
        new = [rid for rid, stream in now.items() if stream == 12]
        assert len(new) == 1, now
        assert new[0] not in old, (new, old)  # the deleted id is never issued again
        consumers = {k["consumer_id"]: k for k in c.stats()["consumers"]}
        # the old position stays the old recording's, and says nothing of the new one
        assert str(new[0]) not in consumers["q"]["positions"], consumers


def test_a_damaged_id_mark_refuses_to_open_the_store_naming_it(tmp_path: Path) -> None:
    """Without its mark the store could issue ids again: a damaged one (a bad disk: it is written
    whole and renamed in) is refused with the file named, not taken as 0."""
    store = RecordingStore(str(tmp_path), fsync=False)
    store.create(7, 1, "test", 5, 5, 0, 64 * 1024, 1408, now_ns=1)
    store.close(2)
    mark = tmp_path / "recordings" / ID_MARK_FILE
    mark.write_bytes(b"\xc1 not msgpack")
    with pytest.raises(IdMarkCorruptError, match=ID_MARK_FILE) as info:
        RecordingStore(str(tmp_path), fsync=False)
    assert info.value.code == ArchiveErrorCode.ID_MARK_CORRUPT
    assert info.value.path == str(mark)


def test_a_server_with_a_damaged_id_mark_says_so_in_one_line_and_exits(tmp_path: Path) -> None:
    """The server's start names the damaged mark in one coded line (ID_MARK_CORRUPT), not a
    traceback of a bare ValueError."""
    recordings = tmp_path / "srv" / "recordings"
    recordings.mkdir(parents=True)
    (recordings / ID_MARK_FILE).write_bytes(b"\xc1 not msgpack")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "aeron_spark.cli",
            "server",
            "--dir",
            str(tmp_path / "srv"),
            "--port",
            "0",
            "--no-encryption",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0, done
    assert "ID_MARK_CORRUPT" in done.stderr and ID_MARK_FILE in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_attack_recordings_deleted_whole_mark_included_reuse_no_id_a_consumer_holds(
    tmp_path: Path,
) -> None:
    """``rm -rf DIR/recordings`` (the mark goes with it): the next recordings took ids 0, 1, ...
    again, and a consumer's committed position of the old recording 1 applied to the new one
    (a query resuming from it would skip the new recording's first messages; retention held or
    purged it by the old position). Ids the consumers' positions name are never issued again;
    the positions themselves are then dropped (their recordings are gone), after the mark is
    past them."""
    directory = tmp_path / "srv"
    with server_process(str(directory)) as (_proc, endpoint), _client(endpoint) as c:
        c.publish(10, [b"ten"])
        end11 = c.publish(11, [b"eleven-%d" % i for i in range(8)])
        old = {r.recording_id: r.stream_id for r in c.list_recordings()}
        c.consumer_commit("q", [11], {max(old): end11})
    shutil.rmtree(directory / "recordings")  # every recording and the id mark

    with server_process(str(directory)) as (_proc, endpoint), _client(endpoint) as c:
        c.publish(10, [b"ten again"])
        c.publish(11, [b"eleven again"])
        now = {r.recording_id: r.stream_id for r in c.list_recordings()}
        assert len(now) == 2, now
        assert not set(now) & set(old), (now, old)  # main: {0: 10, 1: 11} again
        [q] = [k for k in c.stats()["consumers"] if k["consumer_id"] == "q"]
        assert q["positions"] == {}, q  # the old recording's dropped (gone), none new


@pytest.mark.parametrize("mark", [2**64 - 1, 2**63 - 3])
def test_an_id_mark_with_no_room_left_in_int64_is_refused_as_damaged(
    tmp_path: Path, mark: int
) -> None:
    """A mark is ids issued so far: one near 2**63 or past it is a damaged file (a flipped high
    bit), not a store's. Main stopped the start with a bare OverflowError (2**64 - 1) or took it
    (2**63 - 3), its fourth recording id past int64 (Aeron's and Spark's recording id)."""
    recordings = tmp_path / "recordings"
    recordings.mkdir()
    (recordings / ID_MARK_FILE).write_bytes(msgpack.packb({"next_id": mark}))
    with pytest.raises(IdMarkCorruptError, match="ID_MARK_CORRUPT") as info:
        RecordingStore(str(tmp_path), fsync=False)
    assert info.value.path == str(recordings / ID_MARK_FILE)
    assert str(mark) in str(info.value)


# A child that issues ids 0 and 1 (printing each), then is killed with SIGKILL inside the
# mark's advance the third creation makes (ID_BLOCK 2): before the new mark's rename, or after
# it and before its directory's fsync.
_KILLED_IN_THE_MARK = """
import os, signal, sys, time
from aeron_spark.transport.archive import recordings as m
m.ID_BLOCK = 2
directory, point = sys.argv[1], sys.argv[2]
store = m.RecordingStore(directory, fsync=False)
# the spares' thread keeps the mark ahead when poked (a race with the third creation here): the
# creation advances it itself, as one does when that thread did not keep ahead
store.spares.poke = lambda: None
for _ in range(2):
    rec = store.create(10, 1, "session:test", 0, 0, 0, 65536, 1408, time.time_ns())
    print(rec.d.recording_id, flush=True)
real_replace, real_fsync_dir = os.replace, m.fsync_dir
def replace(src, dst):
    if point == "before rename" and dst.endswith(m.ID_MARK_FILE):
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
def fsync_dir(path):
    if point == "after rename" and os.path.exists(os.path.join(path, m.ID_MARK_FILE)):
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync_dir(path)
m.os.replace, m.fsync_dir = replace, fsync_dir
store.create(10, 1, "session:test", 0, 0, 0, 65536, 1408, time.time_ns())
print("not killed", flush=True)
"""


@pytest.mark.parametrize("point", ["before rename", "after rename"])
def test_a_kill_inside_the_marks_advance_issues_no_id_twice(tmp_path: Path, point: str) -> None:
    """Held: killed while the mark advances (its new value written but not renamed in, or
    renamed in but not fsynced), the store restarts past every id it issued."""
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_THE_MARK, str(tmp_path), point],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == -9, done.stderr
    issued = [int(line) for line in done.stdout.split()]
    assert issued == [0, 1], done.stdout
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        rec = store.create(10, 1, "session:test", 0, 0, 0, 64 * 1024, 1408, now_ns=1)
        assert rec.d.recording_id not in issued and rec.d.recording_id >= 2
    finally:
        store.close(2)
    assert not (tmp_path / "recordings" / f"{ID_MARK_FILE}.tmp").exists()


@pytest.mark.parametrize("mark", ["behind", "missing"])
def test_a_mark_behind_the_directories_or_missing_issues_past_every_directory(
    tmp_path: Path, mark: str
) -> None:
    """Held: a mark restored from an older copy (behind) or lost, with the recordings' own
    directories there, starts past the highest of them (an orphan's too)."""
    store = RecordingStore(str(tmp_path), fsync=False)
    made = [store.create(7, 1, "test", 5, 5, 0, 64 * 1024, 1408, now_ns=1) for _ in range(3)]
    store.close(2)
    root = tmp_path / "recordings"
    orphan = root / str(made[-1].d.recording_id + 5)  # data, no descriptor: never issued
    orphan.mkdir()
    (orphan / "index").write_bytes(b"data")
    if mark == "behind":
        (root / ID_MARK_FILE).write_bytes(msgpack.packb({"next_id": 1}))
    else:
        (root / ID_MARK_FILE).unlink()
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        rec = store.create(7, 1, "test", 5, 5, 0, 64 * 1024, 1408, now_ns=3)
        assert rec.d.recording_id > int(orphan.name)
    finally:
        store.close(4)

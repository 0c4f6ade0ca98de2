"""Attacks on spare recording directories (``transport/archive/spares.py``) and the durable mark
of recording ids (``recordings/next_id.msgpack``), over real files and real processes killed with
SIGKILL at the exact point of the attack (a child process that kills itself there).

Broken and fixed: a kill -9 after a spare was renamed in as ``recordings/<id>/`` and before its
descriptor was written left a directory of empty files (the spare's ``acked``, ``index`` and
first segment); the next start took it for a recording with data whose descriptor was lost (an
orphan: a warning naming it, left for the operator for good), though nothing was ever recorded
there. Since the descriptor is written into the spare before its rename (issue 31), a kill
before the rename leaves a spare that is not whole (removed at start), and an empty descriptor
after it (a power cut without ``--fsync``) is nothing recorded.
Broken and fixed: a spare kept at start whose segment file was a symlink (its size, followed,
was 0) made a recording that wrote its messages into the linked file. Held (and kept, they are
cheap): a kill -9 between the descriptor and the first
acknowledged publish leaves an empty recording that is listed, and no id is issued twice; a
full disk while spares are made and when the mark must be advanced issues nothing, adopts
nothing half made, and after the disk frees and a restart no id is issued again; spares are
reused, not made again, by sessions opening and closing; a server out of inodes publishes from
a spare made before, refuses a session without one with STORAGE_FULL and serves on; a server
reuses the spares of sessions that closed without publishing."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.errors import ConnectorError
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport.archive import RecordingStore
from aeron_spark.transport.archive import recordings as recordings_mod
from aeron_spark.transport.archive.spares import FILES, PREFIX, SEGMENT_0
from aeron_spark.transport.archive.testing import MountUnavailable, fill, small_tmpfs

TERM = 64 * 1024
DEADLINE_S = 60.0  # a loaded 2-core machine


def _wait(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _create(store: RecordingStore, stream: int = 10):  # type: ignore[no-untyped-def]
    return store.create(stream, 1, "session:test", 0, 0, 0, TERM, 1408, time.time_ns())


# The child: a store with one spare ready, one recording made, then killed with SIGKILL at
# ``point`` ("rename": the descriptor written into the spare, as the spare is about to be
# renamed in (the descriptor was written after the rename before issue 31's cold start work);
# "acked": the recording made, before a publisher acknowledges anything).
_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from aeron_spark.transport.archive import recordings as m
    directory, point = sys.argv[1], sys.argv[2]
    store = m.RecordingStore(directory, fsync=False)
    store.spares.want(1)
    deadline = time.monotonic() + 60
    while store.spares.ready < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.spares.ready == 1
    store.spares.want(0)  # no other spare made meanwhile: the one taken is the only one
    if point == "rename":
        real = os.rename
        def rename(src, dst, *args, **kwargs):
            if os.path.basename(src).startswith("spare-"):
                os.kill(os.getpid(), signal.SIGKILL)
            real(src, dst, *args, **kwargs)
        os.rename = rename
    rec = store.create(10, 1, "session:test", 0, 0, 0, 65536, 1408, time.time_ns())
    print(rec.d.recording_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _killed_child(directory: Path, point: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), point],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.strip()


def test_a_kill_before_a_spares_rename_leaves_no_orphan_and_no_id_again(tmp_path: Path) -> None:
    assert _killed_child(tmp_path, "rename") == ""  # killed before the rename
    root = tmp_path / "recordings"
    assert not [p for p in root.iterdir() if p.name.isdigit()]  # no recording appeared
    [spare] = [p for p in root.iterdir() if p.name.startswith(PREFIX)]
    assert (spare / "meta.msgpack").stat().st_size > 0  # the descriptor written into it
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        # a spare holding a descriptor is no whole spare: removed, never handed out
        assert store.spares.removed == 1 and store.spares.ready == 0
        assert not spare.exists()
        assert store.orphan_directories == []
        assert store.recordings == {}
        rec = _create(store)
        assert rec.d.recording_id != 0  # the id the killed creation took is never issued again
    finally:
        store.close(time.time_ns())


def test_an_empty_descriptor_after_a_spares_rename_is_no_recording_and_no_orphan(
    tmp_path: Path,
) -> None:
    """A spare's descriptor is written just before its rename: without ``--fsync`` a power cut
    may keep the rename and not the write (an empty ``meta.msgpack`` beside the spare's empty
    files). Made by hand (a power cut cannot be made for a test): the start removes it as
    nothing recorded, and never issues its id again."""
    leftover = tmp_path / "recordings" / "7"
    leftover.mkdir(parents=True)
    for name in FILES:
        (leftover / name).write_bytes(b"")
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert store.orphan_directories == [] and store.recordings == {}
        assert not leftover.exists()
        assert _create(store).d.recording_id > 7
    finally:
        store.close(time.time_ns())


def test_a_kill_before_the_first_acknowledge_leaves_a_listed_empty_recording(
    tmp_path: Path,
) -> None:
    rid = int(_killed_child(tmp_path, "acked"))
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert list(store.recordings) == [rid]  # recovered and listed, empty
        rec = store.get(rid)
        assert rec.recorded_position == rec.d.start_position == 0
        assert store.orphan_directories == []
        assert _create(store).d.recording_id > rid  # its id is not issued again
    finally:
        store.close(time.time_ns())


@pytest.fixture
def tmpfs() -> Iterator[str]:
    try:
        with small_tmpfs(2 * 1024 * 1024, nr_inodes=128) as path:
            yield path
    except MountUnavailable as exc:  # pragma: no cover - the CI machine runs as root
        pytest.fail(f"a tmpfs is needed for this attack: {exc}")


def _fill_names(directory: str) -> str:
    """Make empty files in ``directory``/names until no inode is left; that directory."""
    names = os.path.join(directory, "names")
    os.mkdir(names)
    for n in range(100_000):
        try:
            os.close(os.open(os.path.join(names, str(n)), os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return names
    raise AssertionError("the tmpfs never ran out of names")


def test_a_full_disk_issues_no_id_twice_and_adopts_nothing_half_made(
    tmpfs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recordings_mod, "ID_BLOCK", 2)  # the mark advances at the third create
    store = RecordingStore(tmpfs, fsync=True)
    issued: list[int] = []
    try:
        issued += [_create(store).d.recording_id for _ in range(2)]
        filler, names = fill(tmpfs), _fill_names(tmpfs)  # no byte and no name left
        store.spares.want(3)  # the spares' thread fails on the full disk: counted
        _wait(lambda: store.spares.failures > 0, "no spare failure counted")
        with pytest.raises(OSError):  # the mark cannot be advanced: nothing issued
            _create(store)
        assert not [n for n in os.listdir(store.root) if n.startswith(PREFIX)]  # none half made
        os.unlink(filler)
        shutil.rmtree(names)
        issued.append(_create(store).d.recording_id)  # the mark advances now
    finally:
        store.close(time.time_ns())
    store = RecordingStore(tmpfs, fsync=True)
    try:
        assert store.spares.removed == 0  # nothing half made was left to adopt or remove
        issued.append(_create(store).d.recording_id)
        assert len(set(issued)) == len(issued), issued
        assert sorted(store.recordings) == issued
    finally:
        store.close(time.time_ns())


def test_spares_are_reused_by_sessions_opening_and_closing(tmp_path: Path) -> None:
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        for _ in range(5):  # three sessions open without publishing, then close
            store.spares.want(3)
            _wait(lambda: store.spares.ready >= 3, "spares not made")
            store.spares.want(0)
        assert store.spares.made == 3  # bounded by the most sessions open at once
        assert len([n for n in os.listdir(store.root) if n.startswith(PREFIX)]) == 3
    finally:
        store.close(time.time_ns())


def test_a_kept_spare_holds_only_empty_regular_files_never_a_symlink(tmp_path: Path) -> None:
    """A spare whose segment file is a symlink (to an empty file elsewhere) or a FIFO, left in the
    recordings directory, looked whole (its size followed the link: 0) and was kept: the first
    recording made from it wrote its messages through the link into the other file (a FIFO
    failed every append with ESPIPE). Such a spare is removed at start now."""
    root = tmp_path / "recordings"
    outside = tmp_path / "victim"
    outside.touch()
    elsewhere = tmp_path / "elsewhere"  # a whole spare, but the spare's name is a link to it
    elsewhere.mkdir()
    for name in FILES:
        (elsewhere / name).touch()
    root.mkdir()
    (root / f"{PREFIX}3").symlink_to(elsewhere)
    for n, odd in ((1, "symlink"), (2, "fifo")):
        spare = root / f"{PREFIX}{n}"
        spare.mkdir()
        for name in FILES:
            if name != SEGMENT_0:
                (spare / name).touch()
        if odd == "symlink":
            (spare / SEGMENT_0).symlink_to(outside)
        else:
            os.mkfifo(spare / SEGMENT_0)
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        # main: both kept (ready == 2); a recording made from the symlinked one wrote its
        # messages into victim
        assert store.spares.ready == 0 and store.spares.removed == 3
        assert not [n for n in os.listdir(root) if n.startswith(PREFIX)]
    finally:
        store.close(time.time_ns())
    assert outside.read_bytes() == b""
    assert sorted(os.listdir(elsewhere)) == sorted(FILES)  # the link went, not what it named


def test_a_kept_spare_holds_no_file_with_another_name_a_hard_link(tmp_path: Path) -> None:
    """A spare whose segment file is a hard link to an empty file elsewhere (another recording's
    segment before its first append, a snapshot made with ``cp -al``) is a regular empty file
    to ``lstat``, so it was kept, and the first recording made from it wrote its messages into
    that other file too. Such a spare is removed at start now (one name per file)."""
    root = tmp_path / "recordings"
    outside = tmp_path / "victim"
    outside.touch()
    spare = root / f"{PREFIX}1"
    spare.mkdir(parents=True)
    for name in FILES:
        if name != SEGMENT_0:
            (spare / name).touch()
    os.link(outside, spare / SEGMENT_0)
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert store.spares.ready == 0 and store.spares.removed == 1  # main: kept, ready == 1
        rec = _create(store)
        rec.append(b"\x00" * 64, 0, time.time_ns())
    finally:
        store.close(time.time_ns())
    assert outside.read_bytes() == b""  # main: the new recording's frames


STORAGE_FULL = 14  # ErrorCode.STORAGE_FULL on the wire


def test_a_server_out_of_names_serves_and_publishes_from_spares_or_refuses_coded() -> None:
    """No inode left (the bytes free): a session with a spare ready publishes (a rename needs no
    new name), one without is refused with STORAGE_FULL, the server serves on; once names are
    free a publish works, and after a kill -9 and a restart no id is issued twice and no spare
    kept is half made."""
    try:
        mount = small_tmpfs(8 * 1024 * 1024, nr_inodes=256)
        directory = mount.__enter__()
    except MountUnavailable as exc:  # pragma: no cover - the CI machine runs as root
        pytest.fail(f"a tmpfs is needed for this attack: {exc}")
    try:
        with server_process(directory) as (proc, endpoint):
            with client_for(endpoint, timeout_s=60) as early:
                _wait(lambda: early.stats()["store"]["spare_recordings_ready"] >= 1, "no spare")
                names = _fill_names(directory)
                with client_for(endpoint, timeout_s=60) as late:
                    _wait(
                        lambda: early.stats()["store"]["spare_recordings_failures"] >= 1,
                        "the spares' thread did not fail",
                    )
                    early.publish(10, [b"from a spare"])  # its spare was made before
                    with pytest.raises(ConnectorError) as refused:
                        late.publish(11, [b"no spare, no name"])
                    assert refused.value.code == STORAGE_FULL, refused.value
                    assert [r.stream_id for r in late.list_recordings()] == [10]
                    shutil.rmtree(names)
                    late.publish(11, [b"room again"])
                    before = {r.recording_id for r in late.list_recordings()}
                    assert len(before) == 2
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        with server_process(directory) as (_proc, endpoint), client_for(endpoint) as client:
            client.publish(12, [b"after the restart"])
            after = {r.recording_id: r.stream_id for r in client.list_recordings()}
            assert sorted(after.values()) == [10, 11, 12]
            assert set(after) > before  # the two kept, a third with a new id
        root = os.path.join(directory, "recordings")
        for name in os.listdir(root):
            if name.startswith(PREFIX):
                assert sorted(os.listdir(os.path.join(root, name))) == sorted(FILES), name
    finally:
        mount.__exit__(None, None, None)


def test_a_server_reuses_its_spares_for_sessions_opening_and_closing(tmp_path: Path) -> None:
    """Sessions that close without publishing leave their spares for the next ones: a second
    wave of as many sessions makes no spare more (the server counts a closed session out)."""
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        with client_for(endpoint, timeout_s=60) as observer:

            def store() -> dict[str, int]:
                return observer.stats()["store"]  # type: ignore[no-any-return]

            for wave in range(2):
                clients = [client_for(endpoint, timeout_s=60) for _ in range(3)]
                _wait(lambda: store()["spare_recordings_ready"] >= 4, "spares not made")
                for c in clients:
                    c.close()
                _wait(
                    lambda w=wave: observer.stats()["counters"]["sessions_closed"] >= 3 * (w + 1),
                    "the sessions were not closed",
                )
            assert store()["spare_recordings_made"] == 4  # the observer's and three, once
            assert store()["spare_recordings_taken"] == 0


def test_a_spare_removed_under_a_running_store_is_made_again(tmp_path: Path) -> None:
    """A ready spare deleted while the store runs (an operator clearing ``spare-*``): the
    creation that took it finds it gone and makes its directory itself, as before, and the pool
    makes a new spare. Before, the gone spare was given back as ready: every later creation took
    it, failed to rename it and made its files itself, and no spare was made again."""
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        store.spares.want(1)
        _wait(lambda: store.spares.ready >= 1, "no spare made")
        [gone] = [n for n in os.listdir(store.root) if n.startswith(PREFIX)]
        shutil.rmtree(os.path.join(store.root, gone))
        first = _create(store)
        assert sorted(os.listdir(first.directory)) == ["meta.msgpack"]  # made here, as before
        _wait(
            lambda: [n for n in os.listdir(store.root) if n.startswith(PREFIX)] not in ([], [gone]),
            "no spare made again",
        )
        _wait(lambda: store.spares.ready >= 1, "the new spare is not ready")
        store.spares.want(0)
        second = _create(store)
        assert store.spares.taken == 2
        assert "acked" in os.listdir(second.directory)  # a spare's files: renamed in
    finally:
        store.close(time.time_ns())


def test_spares_made_for_a_peak_are_trimmed_once_the_sessions_go(tmp_path: Path) -> None:
    """Spares made for a peak of sessions (want(3)) stayed on disk once they went (want(1)):
    a server that once had 2,048 sessions kept 2,048 directories of empty files for good.
    Those in excess for ``trim_after_s`` are removed now (counted), off the caller's thread;
    the ones still wanted stay, and the next start adopts and trims alike."""
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        store.spares.trim_after_s = 0.2  # 60 s by default: a wave of sessions reuses them
        store.spares.want(3)
        _wait(lambda: store.spares.ready >= 3, "spares not made")
        store.spares.want(1)
        # main: three spares for good
        _wait(lambda: store.spares.ready == 1, "spares not trimmed")
        _wait(
            lambda: len([n for n in os.listdir(store.root) if n.startswith(PREFIX)]) == 1,
            "trimmed spares still on disk",
        )
        # counted after its directory is removed (a look between the two saw 1)
        _wait(lambda: store.spares.stats()["spare_recordings_trimmed"] == 2, "trims not counted")
        rec = _create(store)  # the one kept serves
        assert store.spares.taken == 1 and rec.d.recording_id == 0
    finally:
        store.close(time.time_ns())

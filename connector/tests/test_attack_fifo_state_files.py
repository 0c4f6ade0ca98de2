"""Attack: a FIFO (or another file that is not a regular file) put in place of a file the server
reads at start in its data directory: the recordings' id mark (``recordings/next_id.msgpack``),
a recording's descriptor (``meta.msgpack``) or acknowledged end (``acked``), the consumers'
positions (``consumers.msgpack``), the sink commit log (``commit.log``); and the server's
authorisation file and its key.

Broken and fixed: ``open()`` of a FIFO for reading waits for a writer, so the server's start
hung for good on any of them (no error, no log line). Each is now opened non-blocking and
without following a symlink, checked to be a regular file (``fstat``), and otherwise: the id
mark, the consumers' positions and the commit log refuse the start with a coded error naming
the file; a recording's descriptor is a damaged one (the directory left as it is, not served,
its id never issued); a recording's ``acked`` is ignored as a damaged one is.

Each open runs on a thread; one still blocked after the bound is released by opening the FIFO
for writing (so the test ends) and the test fails saying it hung."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.connector.server.authz import Authorizer
from aeron_spark.connector.server.commitlog import CommitLog
from aeron_spark.connector.server.retention import ConsumerRegistry
from aeron_spark.handshake.errors import KeyStoreError
from aeron_spark.handshake.keystore import SERVER_KEY_FILE, KeyStore
from aeron_spark.transport.archive import RecordingStore
from aeron_spark.transport.archive.diskio import NotRegularFileError
from aeron_spark.transport.archive.errors import IdMarkCorruptError

BOUND_S = 30.0  # an open that returns does so at once; 30 s is a loaded machine's margin
TERM = 64 * 1024


def _bounded(fn: Callable[[], Any], fifo: Path) -> tuple[Any, BaseException | None]:
    """``fn()`` on a thread: its result or its error; fails the test if it hangs (the FIFO's
    reader is released first by a writer that opens and closes it)."""
    out: list[Any] = [None, None]

    def run() -> None:
        try:
            out[0] = fn()
        except BaseException as exc:
            out[1] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        deadline = time.monotonic() + BOUND_S
        while thread.is_alive() and time.monotonic() < deadline:
            try:  # a writer lets a blocked reader's open return (then EOF)
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            thread.join(0.1)
        pytest.fail(f"opening with a FIFO at {fifo} hung for {BOUND_S:.0f} s (open blocked)")
    return out[0], out[1]


def _store_with_one_recording(directory: Path) -> int:
    store = RecordingStore(str(directory), fsync=False)
    try:
        rec = store.create(10, 1, "session:test", 0, 0, 0, TERM, 1408, time.time_ns())
        return rec.d.recording_id
    finally:
        store.close(0)


def test_fifo_id_mark_refuses_the_store_with_its_coded_error(tmp_path: Path) -> None:
    _store_with_one_recording(tmp_path)
    mark = tmp_path / "recordings" / "next_id.msgpack"
    mark.unlink()
    os.mkfifo(mark)
    store, exc = _bounded(lambda: RecordingStore(str(tmp_path), fsync=False), mark)
    if store is not None:
        store.close(0)
    assert isinstance(exc, IdMarkCorruptError), exc
    assert str(mark) in str(exc) and "not a regular file" in str(exc)
    assert mark.exists() and not mark.is_file()  # left as it is, for the operator


@pytest.mark.parametrize("name", ["meta.msgpack", "acked"])
def test_fifo_in_a_recording_is_damaged_not_a_hang(tmp_path: Path, name: str) -> None:
    rid = _store_with_one_recording(tmp_path)
    victim = tmp_path / "recordings" / str(rid) / name
    victim.unlink(missing_ok=True)  # (a recording with nothing acknowledged has no acked)
    os.mkfifo(victim)
    store, exc = _bounded(lambda: RecordingStore(str(tmp_path), fsync=False), victim)
    assert exc is None, exc
    try:
        if name == "meta.msgpack":  # a damaged descriptor: left, not served, id not issued
            assert rid not in store.recordings
            assert str(victim.parent) in store.orphan_directories
            made = store.create(10, 1, "session:test", 0, 0, 0, TERM, 1408, time.time_ns())
            assert made.d.recording_id > rid
        else:  # a damaged acknowledged end: ignored, the recording served
            assert rid in store.recordings
    finally:
        store.close(0)
    assert victim.exists() and not victim.is_file()


def test_fifo_stop_file_refuses_with_a_coded_error(tmp_path: Path) -> None:
    """A recording's stop file that does not read stops the store's start (as a torn one
    does): now at once, with the code and the file's name."""
    rid = _store_with_one_recording(tmp_path)
    victim = tmp_path / "recordings" / str(rid) / "stop.msgpack"
    victim.unlink()
    os.mkfifo(victim)
    store, exc = _bounded(lambda: RecordingStore(str(tmp_path), fsync=False), victim)
    if store is not None:
        store.close(0)
    assert isinstance(exc, NotRegularFileError), exc
    assert exc.path == str(victim) and "NOT_REGULAR_FILE" in str(exc)


def test_fifo_consumer_positions_refuse_with_a_coded_error(tmp_path: Path) -> None:
    victim = tmp_path / "consumers.msgpack"
    os.mkfifo(victim)
    _, exc = _bounded(lambda: ConsumerRegistry(str(tmp_path)), victim)
    assert isinstance(exc, NotRegularFileError), exc
    assert exc.code.name == "NOT_REGULAR_FILE" and exc.path == str(victim)
    assert str(victim) in str(exc)


def test_fifo_commit_log_refuses_with_a_coded_error(tmp_path: Path) -> None:
    victim = tmp_path / "commit.log"
    os.mkfifo(victim)
    _, exc = _bounded(lambda: CommitLog(str(victim)), victim)
    assert isinstance(exc, NotRegularFileError), exc
    assert str(victim) in str(exc)


def test_symlink_commit_log_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    victim = tmp_path / "commit.log"
    victim.symlink_to(target)
    _, exc = _bounded(lambda: CommitLog(str(victim)), victim)
    assert isinstance(exc, NotRegularFileError), exc
    assert str(victim) in str(exc)


def test_fifo_authorisation_file_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    """The authorisation file (``--authz``, read at start and reloaded by the loop)."""
    victim = tmp_path / "authz.toml"
    os.mkfifo(victim)
    _, exc = _bounded(lambda: Authorizer(str(victim)), victim)
    assert isinstance(exc, OSError), exc  # as an unreadable file is: the start refused
    assert str(victim) in str(exc) and "NOT_REGULAR_FILE" in str(exc)


def test_fifo_server_key_is_refused_not_a_hang(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    victim = keys / SERVER_KEY_FILE
    os.mkfifo(victim, 0o600)
    _, exc = _bounded(lambda: KeyStore(keys).server_private_key(), victim)
    assert isinstance(exc, KeyStoreError), exc
    assert str(victim) in str(exc) and "not a regular file" in str(exc)


@pytest.mark.parametrize("name", [f"{0:020d}.seg", "index"])
def test_fifo_segment_or_index_refuses_with_a_coded_error(tmp_path: Path, name: str) -> None:
    """A FIFO in place of a recording's segment or index file: recovery opened it read-write
    (which does not block) and took it for an empty file; the store started on it."""
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        rec = store.create(10, 1, "session:test", 0, 0, 0, TERM, 1408, time.time_ns())
        rid = rec.d.recording_id
    finally:
        store.close(0)
    directory = tmp_path / "recordings" / str(rid)
    (directory / "stop.msgpack").unlink()  # a crash while recording: recovered at start
    victim = directory / name
    victim.unlink(missing_ok=True)
    os.mkfifo(victim)
    store, exc = _bounded(lambda: RecordingStore(str(tmp_path), fsync=False), victim)
    if store is not None:
        store.close(0)
    assert isinstance(exc, NotRegularFileError), exc
    assert exc.path == str(victim)

"""Attacks on a new recording's directory (fifteenth session: a directory made just now is not
recovered; a leftover one is): a recording directory whose descriptor (``meta.msgpack``) was
lost while its data stayed (a failing disk, a power cut before the descriptor's fsync, an
operator's slip). The store skipped it at start and gave its id to the next recording made,
whose creation found the directory there and recovered what it held: the new recording (another
stream, another client) began with the old recording's data, served to whoever may read the new
stream. A leftover directory with files in it is never given to a new recording now."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import msgpack
import pytest

from aeron_spark.connector.server.testing import client_for, messages_of, server_process
from aeron_spark.transport.archive import RecordingStore


def _payloads(client, stream: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    out: list[bytes] = []
    for rec in client.list_recordings([stream]):
        if rec.recorded_position > rec.start_position:
            blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            out += [m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)]
    return out


def test_a_recording_whose_descriptor_was_lost_never_lends_its_data_to_a_new_one(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "srv"
    secret = [b"stream-10-secret-%d" % i for i in range(5)]
    with server_process(str(directory)) as (proc, endpoint), client_for(endpoint) as client:
        client.publish(10, secret)
        [rec] = client.list_recordings([10])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    leftover = directory / "recordings" / str(rec.recording_id)
    (leftover / "meta.msgpack").unlink()  # its descriptor lost, its data kept
    kept = sorted(p.name for p in leftover.iterdir())
    with server_process(str(directory)) as (_proc, endpoint), client_for(endpoint) as client:
        client.publish(20, [b"stream-20-own"])
        [new] = client.list_recordings([20])
        got = _payloads(client, 20)
        # main: the new recording took the leftover's id and began with stream 10's messages
        assert got == [b"stream-20-own"], got
        assert new.recording_id != rec.recording_id
    assert sorted(p.name for p in leftover.iterdir()) == kept  # left for the operator


_DAMAGED = {
    "empty": b"",  # a power cut before the descriptor's fsync
    "torn": msgpack.packb({"recording_id": 3, "stream_id": 10})[:9],
    "not msgpack": b"\xc1\xc1\xc1",
    "other keys": msgpack.packb({"x": 1}),
    "a list": msgpack.packb([1, 2, 3]),
    "wrong types": msgpack.packb(
        {
            "recording_id": "3",
            "stream_id": 10,
            "session_id": 1,
            "source": "s",
            "start_position": 0,
            "start_timestamp_ns": 0,
            "initial_term_id": 0,
            "term_length": 65536,
            "mtu": 1408,
            "segment_length": 1 << 26,
        }
    ),
}


@pytest.mark.parametrize("damage", sorted(_DAMAGED))
def test_a_damaged_descriptor_or_a_file_with_a_digit_name_is_left_not_fatal(
    tmp_path: Path, damage: str
) -> None:
    """README: a recording directory with data whose descriptor is lost *or damaged* is left as
    it is, not served, its id never issued again. Main stopped the store's start (and the
    server's) with a bare FormatError, ValueError or TypeError for a damaged descriptor, and with
    NotADirectoryError for a file with a digit name in ``recordings/`` (an fsck's leftover)."""
    root = tmp_path / "recordings"
    (root / "3").mkdir(parents=True)
    (root / "3" / "meta.msgpack").write_bytes(_DAMAGED[damage])
    (root / "3" / "index").write_bytes(b"kept" * 4)
    (root / "9").write_bytes(b"a file, not a recording directory")
    (root / "\u00b2").mkdir()  # a digit to str.isdigit, not to int()
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert store.recordings == {}
        assert store.orphan_directories == [str(root / "3")]
        assert store.stray_files == [str(root / "9")]  # a file: counted as stray, not an orphan
        rec = store.create(20, 1, "session:test", 0, 0, 0, 64 * 1024, 1408, time.time_ns())
        assert rec.d.recording_id > 9  # neither id is issued
    finally:
        store.close(time.time_ns())
    assert (root / "3" / "meta.msgpack").read_bytes() == _DAMAGED[damage]  # left as it was
    assert (root / "3" / "index").read_bytes() == b"kept" * 4
    assert (root / "9").read_bytes() == b"a file, not a recording directory"


def test_a_stray_file_with_a_recording_id_name_does_not_stop_the_server(tmp_path: Path) -> None:
    """A regular file named like a recording (``recordings/<digits>``: an operator's note, a
    copy gone wrong) made the server unstartable (main: ``NotADirectoryError`` reading
    ``recordings/<n>/meta.msgpack``). It is skipped now, named in a warning and counted
    (``stray_recording_files``), left as it is, and its id is never issued (a new recording
    there would collide with the file)."""
    directory = tmp_path / "srv"
    with server_process(str(directory)) as (proc, endpoint), client_for(endpoint) as client:
        client.publish(10, [b"kept"])
        [rec] = client.list_recordings([10])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    stray = directory / "recordings" / str(rec.recording_id + 1)  # the next id to be issued
    stray.write_bytes(b"not a recording")
    with server_process(str(directory)) as (_proc, endpoint), client_for(endpoint) as client:
        assert _payloads(client, 10) == [b"kept"]  # the real recording still served
        client.publish(20, [b"stream-20-own"])
        [new] = client.list_recordings([20])
        assert new.recording_id not in (rec.recording_id, int(stray.name))
        assert _payloads(client, 20) == [b"stream-20-own"]
        assert client.stats()["store"]["stray_recording_files"] == 1
    assert stray.read_bytes() == b"not a recording"  # left for the operator

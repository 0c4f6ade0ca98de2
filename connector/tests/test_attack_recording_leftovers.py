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
from pathlib import Path

from aeron_spark.connector.server.testing import client_for, messages_of, server_process


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

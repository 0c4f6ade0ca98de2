"""Frames past a sink recording's visible end at a restart never become visible.

A commit whose append failed is cut back off its recording (``SinkCommitter._fail``) and
cancelled; should that cut fail too (``Recording._cut`` logs it and goes on: "the next append
overwrites what is left, until then only a crash would show them"), the frames stay on disk
past the committed end. After a crash the recording's recovery walks complete frames, so its
recorded end was past the visible one, and the next commit started there: its ``done`` made the
failed commit's frames visible with it. Now recovery cuts every sink recording back to its
visible (committed) end first.

The store is what a failed cut then ``kill -9`` leaves: a real server commits batches 0 and 1
and is killed; the commit log's ``done`` of batch 1 is replaced by the ``cancel`` a failed commit
writes (its frames stay on disk, as after a failed cut). A real server restarted on it must serve
batch 0 only, then batch 0 and batch 2 once batch 2 is committed.
"""

from __future__ import annotations

import os
import struct
import zlib

import msgpack
import pytest

from aeron_spark.connector.server.testing import client_for, messages_of, server_process

SINK_STREAM = 11
SINK_ID = "tail-sink"


def _rows(tag: bytes, count: int) -> list[bytes]:
    return [tag + b"-%06d-" % i + b"z" * 300 for i in range(count)]


def _rewrite_log(path: str, change) -> None:
    """Rewrite the commit log at ``path`` with ``change(record)`` for each of its records."""
    with open(path, "rb") as fh:
        data = fh.read()
    records, offset = [], 0
    while offset + 8 <= len(data):
        length, crc = struct.unpack_from("<II", data, offset)
        body = data[offset + 8 : offset + 8 + length]
        assert len(body) == length and zlib.crc32(body) == crc
        records.append(msgpack.unpackb(body, raw=False))
        offset += 8 + length
    out = bytearray()
    for record in records:
        body = msgpack.packb(change(record), use_bin_type=True)
        out += struct.pack("<II", len(body), zlib.crc32(body)) + body
    with open(path, "wb") as fh:
        fh.write(out)


def _sink_rows(endpoint: str) -> list[bytes]:
    with client_for(endpoint, timeout_s=60) as c:
        (rec,) = c.list_recordings([SINK_STREAM])
        msgs = messages_of(
            c.replay(rec.recording_id, rec.start_position, rec.recorded_position),
            rec.initial_term_id,
            rec.term_length,
        )
        return [m.payload for m in msgs]


@pytest.mark.slow
def test_frames_past_a_sink_recordings_visible_end_stay_invisible_after_a_restart(
    tmp_path,
) -> None:
    directory = str(tmp_path / "srv")
    first, failed, later = _rows(b"a", 500), _rows(b"b", 2000), _rows(b"c", 300)
    with server_process(directory) as (_proc, endpoint):  # killed (SIGKILL) on leaving
        with client_for(endpoint, timeout_s=60) as c:
            for batch, rows in ((0, first), (1, failed)):
                part = c.stage(SINK_ID, batch, 0, 0, SINK_STREAM, rows)
                assert c.commit(SINK_ID, batch, SINK_STREAM, [part])["count"] == len(rows)

    def as_failed(record: dict) -> dict:
        if record["t"] == "done" and record["batch_id"] == 1:
            return {"t": "cancel", "sink_id": SINK_ID, "batch_id": 1}
        return record

    _rewrite_log(os.path.join(directory, "sink", "commit.log"), as_failed)
    with server_process(directory) as (_proc, endpoint):
        assert _sink_rows(endpoint) == first
        with client_for(endpoint, timeout_s=60) as c:
            part = c.stage(SINK_ID, 2, 0, 0, SINK_STREAM, later)
            assert c.commit(SINK_ID, 2, SINK_STREAM, [part])["count"] == len(later)
            cut = c.stats()["counters"].get("sink_tail_bytes_cut")
        got = _sink_rows(endpoint)
    assert got == first + later, (
        f"{len(got)} rows visible, {sum(r.startswith(b'b-') for r in got)} of the cancelled batch"
    )
    assert cut is not None and cut > 0, cut  # counted

"""Frames of a refused publish never become visible after a crash.

A publish whose append failed half-way (a full disk, an I/O error) is cut back off its recording
(``_Publisher.publish`` rolls back) and answered with the error; should that cut fail too
(``Recording._cut`` logs it and goes on: "until then only a crash would show them"), its complete
frames stay on disk past the recorded end. After ``kill -9`` the recording's recovery walked the
complete frames, so the refused publish became readable, and a client that published it again
(it was told it failed) had it twice. The same holds for a crash between the blocks of a publish
larger than one write: its first blocks were recovered, never acknowledged. Now the server keeps
each publish recording's acknowledged end on disk (``acked``, written after a publish's frames,
before its answer) and recovery cuts complete frames past it (``store.publish_tail_bytes_cut``).

The store is what a failed cut then ``kill -9`` leaves: a real server acknowledges publish A and
is killed with the session open; the frames of publish B, framed as the server frames them at
A's end, are written past it (as after B's failed cut, or a crash before B's last block). A
real server restarted on it must serve A only; B published again is then read once.
"""

from __future__ import annotations

import os
import signal

import msgpack
import pytest

from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.server.testing import client_for, messages_of, server_process
from aeron_spark.transport.protocol.logbuffer import LogGeometry

STREAM = 13


def _msgs(tag: bytes, count: int) -> list[bytes]:
    return [tag + b"-%06d-" % i + b"p" * 200 for i in range(count)]


def _stream_payloads(endpoint: str) -> list[bytes]:
    out: list[bytes] = []
    with client_for(endpoint, timeout_s=60) as c:
        for rec in sorted(c.list_recordings([STREAM]), key=lambda r: r.recording_id):
            if rec.recorded_position > rec.start_position:
                msgs = messages_of(
                    c.replay(rec.recording_id, rec.start_position, rec.recorded_position),
                    rec.initial_term_id,
                    rec.term_length,
                )
                out += [m.payload for m in msgs]
    return out


def _write_refused_publish(recording_dir: str, position: int, payloads: list[bytes]) -> None:
    """Frame ``payloads`` at ``position`` as the server does and write them into the segment."""
    with open(os.path.join(recording_dir, "meta.msgpack"), "rb") as fh:
        d = msgpack.unpackb(fh.read(), raw=False)
    geometry = LogGeometry(d["term_length"], d["mtu"], d["initial_term_id"])
    framer = Framer(geometry, d["session_id"], d["stream_id"], position, max_block_bytes=8192)
    base = position - position % d["segment_length"]
    with open(os.path.join(recording_dir, f"{base:020d}.seg"), "r+b") as fh:
        for at, block in framer.frame(payloads):
            fh.seek(at - base)
            fh.write(bytes(block))


@pytest.mark.slow
@pytest.mark.parametrize("fsync", [False, True])
def test_a_refused_publish_left_on_disk_stays_invisible_after_kill_9(tmp_path, fsync) -> None:
    directory = str(tmp_path / "srv")
    acked, refused = _msgs(b"a", 300), _msgs(b"b", 500)
    extra = ["--fsync"] if fsync else []
    with server_process(directory, extra) as (proc, endpoint):
        with client_for(endpoint, timeout_s=60) as c:
            end = c.publish(STREAM, acked)
            (rec,) = c.list_recordings([STREAM])
            os.kill(proc.pid, signal.SIGKILL)  # the session still open: no stop file
            proc.wait(30)
    rec_dir = os.path.join(directory, "recordings", str(rec.recording_id))
    assert not os.path.exists(os.path.join(rec_dir, "stop.msgpack"))
    _write_refused_publish(rec_dir, end, refused)

    with server_process(directory, extra) as (_proc, endpoint):
        seen = _stream_payloads(endpoint)
        assert seen == acked, f"{len(seen)} messages, {len(seen) - len(acked)} of the refused"
        with client_for(endpoint, timeout_s=60) as c:
            c.publish(STREAM, refused)  # the client was told it failed: it publishes again
            cut = c.stats()["store"].get("publish_tail_bytes_cut")
        seen = _stream_payloads(endpoint)
    assert seen == acked + refused, f"{len(seen)} messages, {len(acked) + len(refused)} expected"
    assert cut is not None and cut > 0, cut  # counted

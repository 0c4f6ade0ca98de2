"""The archive on its own (no server, no Spark): record a live UDP or IPC stream with a Recorder,
replay any range by position byte for byte, boundaries, purge, restart."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler, Header
from aeron_spark.transport.archive import (
    NotFrameBoundaryError,
    PurgedError,
    Recorder,
    RecordingStore,
)
from aeron_spark.transport.protocol.term import read_term
from aeron_spark.transport.testing import free_udp_port, recorded_payloads


def _read_all(rec, start: int, end: int) -> bytes:  # type: ignore[no-untyped-def]
    chunks, position = [], start
    while position < end:
        position, frames, _ = rec.read(position, 1 << 20, end)
        chunks.append(frames)
    return b"".join(chunks)


@pytest.mark.parametrize("media", ["udp", "ipc"])
def test_record_a_live_stream_and_replay_ranges_byte_for_byte(tmp_path: Path, media: str) -> None:
    rng = random.Random(3)
    payloads = [bytes([i % 251]) * rng.choice((1, 100, 1400, 5000)) for i in range(3000)]
    config = DriverConfig(directory=tmp_path / "driver", write_counters_file=False)
    store = RecordingStore(str(tmp_path / "archive"), fsync=False)
    with Driver(config) as driver:
        if media == "udp":
            port = free_udp_port()
            sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 5)
            pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=256k", 5)
        else:
            sub = driver.add_subscription("aeron:ipc", 5)
            pub = driver.add_publication("aeron:ipc?term-length=256k", 5)
        recorder = Recorder(store, sub, source=media)
        assert pub.wait_until_connected(30)
        for payload in payloads:
            while pub.offer(payload) < 0:
                recorder.do_work()
        deadline = time.monotonic() + 30
        rec = None
        while time.monotonic() < deadline:
            recorder.do_work()
            rec = recorder.recording_of(sub.images[0]) if sub.images else None
            if rec is not None and rec.recorded_position >= pub.position:
                break
            sub.wait(0.01)
        assert rec is not None and rec.recorded_position == pub.position
        pub.close()
        recorder.close()
    itid, term = rec.d.initial_term_id, rec.d.term_length
    everything = _read_all(rec, rec.d.start_position, rec.recorded_position)
    assert recorded_payloads(everything, itid, term) == payloads
    # Any message boundary is a valid start: find the 1000th message's.
    boundaries: list[int] = []

    def note(payload: memoryview, header: Header) -> None:
        boundaries.append(header.position)

    _messages_positions = FragmentAssembler(note)
    header = Header(itid, term.bit_length() - 1)
    view = memoryview(everything)
    offset = 0
    while offset < len(view):
        _, offset = read_term(view, offset, _messages_positions, 1 << 30, header, len(view))
    middle = boundaries[999]
    tail = _read_all(rec, middle, rec.recorded_position)
    assert recorded_payloads(tail, itid, term) == payloads[1000:]
    with pytest.raises(NotFrameBoundaryError) as info:
        rec.check_position(middle + 8, rec.recorded_position, "replay start")
    assert info.value.details
    store.close(time.time_ns())
    # From disk again: the recording, its stop position and its bytes are all there.
    again = RecordingStore(str(tmp_path / "archive"), fsync=False)
    (reopened,) = again.recordings.values()
    assert reopened.stop_position == rec.recorded_position
    assert reopened.d.source.startswith(f"{media}:")
    assert _read_all(reopened, reopened.d.start_position, reopened.recorded_position) == everything
    reopened.purge(middle)
    with pytest.raises(PurgedError):
        reopened.check_position(reopened.d.start_position, reopened.recorded_position, "start")
    tail = _read_all(reopened, middle, reopened.recorded_position)
    assert recorded_payloads(tail, itid, term) == payloads[1000:]
    again.close(time.time_ns())

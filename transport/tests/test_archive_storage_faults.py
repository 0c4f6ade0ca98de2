"""Recordings on a disk that fills up, writes short, or runs a process out of descriptors
(issue 15): no position past what is in the files, nothing torn left behind, stopping never
fails, and a stopped recording holds no descriptor."""

from __future__ import annotations

import errno
import os
import struct
import time
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.archive import Recorder, Recording, RecordingStore
from aeron_spark.transport.archive.recordings import Descriptor
from aeron_spark.transport.archive.testing import (
    MountUnavailable,
    fill,
    open_fds,
    small_tmpfs,
)
from aeron_spark.transport.testing import recorded_payloads

TERM = 1024 * 1024
FRAME = 1024  # aligned DATA frames of 992 payload bytes
_HEADER = struct.Struct("<iBBhiiiiq")
INITIAL_TERM_ID = 7


def block(position: int, count: int = 16, stamp: int = 0) -> bytes:
    """``count`` DATA frames as they are at ``position`` in a stream (within one term)."""
    out = bytearray()
    for i in range(count):
        at = position + i * FRAME
        term_id = INITIAL_TERM_ID + at // TERM
        out += _HEADER.pack(FRAME, 0, 0xC0, 1, at % TERM, 42, 10, term_id, 0)
        out += bytes([(stamp + at // FRAME) % 251]) * (FRAME - _HEADER.size)
    return bytes(out)


def new_recording(store: RecordingStore) -> Recording:
    return store.create(10, 42, "test", INITIAL_TERM_ID, INITIAL_TERM_ID, 0, TERM, 4096, 1)


def read_all(rec: Recording, end: int) -> bytes:
    chunks, position = [], rec.d.start_position
    while position < end:
        new, frames, _ = rec.read(position, 1 << 20, end)
        assert new > position, f"no whole frame at {position} below {end}"
        chunks.append(frames)
        position = new
    return b"".join(chunks)


def test_short_writes_are_continued_until_every_byte_is_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwrite = os.pwrite

    def short_pwrite(fd: int, data: bytes, offset: int) -> int:  # a file system writing less
        return real_pwrite(fd, bytes(memoryview(data)[:777]), offset)

    store = RecordingStore(str(tmp_path), fsync=False)
    rec = new_recording(store)
    expected = b""
    monkeypatch.setattr(os, "pwrite", short_pwrite)
    for i in range(20):
        data = block(rec.recorded_position, stamp=i)
        rec.append(data, rec.recorded_position, 1000 + i)
        expected += data
    monkeypatch.undo()
    acked = rec.recorded_position
    store.close(0)

    again = RecordingStore(str(tmp_path), fsync=False)
    rec = again.get(rec.d.recording_id)
    assert rec.recorded_position == acked == len(expected)  # recovery found every frame
    assert read_all(rec, acked) == expected
    again.close(0)


def test_a_write_that_fails_half_way_is_cut_off_and_the_position_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordingStore(str(tmp_path), fsync=False)
    rec = new_recording(store)
    first = block(0)
    rec.append(first, 0, 1)
    real_pwrite = os.pwrite
    calls = []

    def failing_pwrite(fd: int, data: bytes, offset: int) -> int:  # half fits, then it is full
        calls.append(len(data))
        if len(calls) == 1:
            return real_pwrite(fd, bytes(memoryview(data)[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    with pytest.raises(OSError) as failed:
        rec.append(block(len(first)), len(first), 2)
    monkeypatch.undo()
    assert failed.value.errno == errno.ENOSPC
    assert rec.recorded_position == len(first)
    segment = rec._segment_path(0)
    assert os.path.getsize(segment) == len(first)  # the half written was cut off again
    # the same append, once there is room, continues at the same position
    rec.append(block(len(first), stamp=5), len(first), 3)
    assert read_all(rec, rec.recorded_position) == first + block(len(first), stamp=5)
    store.close(0)


def test_a_failed_append_across_segments_leaves_no_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "rec"
    directory.mkdir()
    d = Descriptor(0, 10, 42, "test", 0, 0, INITIAL_TERM_ID, 64 * 1024, 4096, 64 * 1024)
    rec = Recording(str(directory), d, fsync=False)
    rec.append(b"".join(_small_frames(0, 48)), 0, 1)  # 48 KiB of the first 64 KiB segment
    real_pwrite = os.pwrite

    def second_segment_full(fd: int, data: bytes, offset: int) -> int:
        if os.fstat(fd).st_size == 0 and offset == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", second_segment_full)
    with pytest.raises(OSError):
        rec.append(b"".join(_small_frames(48 * 1024, 32)), 48 * 1024, 2)  # 16 KiB + 16 KiB
    monkeypatch.undo()
    assert rec.recorded_position == 48 * 1024
    assert sorted(p.name for p in directory.glob("*.seg")) == [f"{0:020d}.seg"]
    assert os.path.getsize(rec._segment_path(0)) == 48 * 1024
    rec.close()


def _small_frames(position: int, count: int) -> list[bytes]:
    term = 64 * 1024
    out = []
    for i in range(count):
        at = position + i * FRAME
        head = _HEADER.pack(FRAME, 0, 0xC0, 1, at % term, 42, 10, INITIAL_TERM_ID + at // term, 0)
        out.append(head + bytes(FRAME - _HEADER.size))
    return out


def test_reading_a_segment_shorter_than_its_frame_returns_no_frame_instead_of_recursing(
    tmp_path: Path,
) -> None:
    store = RecordingStore(str(tmp_path), fsync=False)
    rec = new_recording(store)
    big = 8192  # one frame, larger than the read asks for
    frame = _HEADER.pack(big, 0, 0xC0, 1, 0, 42, 10, INITIAL_TERM_ID, 0) + bytes(big - 32)
    rec.append(frame, 0, 1)
    os.truncate(rec._segment_path(0), 4096)  # what the old append left on a full disk
    end, frames, _ts = rec.read(0, 1024, rec.recorded_position)
    assert (end, frames) == (0, b"")  # no whole frame: the caller reports a damaged segment
    store.close(0)


def test_stopped_recordings_hold_no_descriptors_and_replays_share_a_bounded_cache(
    tmp_path: Path,
) -> None:
    store = RecordingStore(str(tmp_path), fsync=False)
    before = open_fds()
    recs = []
    for i in range(300):  # short-lived producers: a recording each
        rec = new_recording(store)
        rec.append(block(0, 2, stamp=i), 0, 1)
        rec.stop(2)
        recs.append(rec)
    assert open_fds() <= before + 1, "stopped recordings still hold descriptors"
    capacity = store.files.capacity
    for i, rec in enumerate(recs):  # replays of every one of them
        assert read_all(rec, rec.recorded_position) == block(0, 2, stamp=i)
        assert open_fds() <= before + capacity + 1
    store.close(0)
    assert open_fds() <= before


def test_a_full_tmpfs_fails_appends_whole_stops_anyway_and_appends_resume_when_freed() -> None:
    try:
        mount = small_tmpfs(2 * 1024 * 1024)
        directory = mount.__enter__()
    except MountUnavailable as exc:
        pytest.skip(str(exc))
    try:
        store = RecordingStore(os.path.join(directory, "archive"), fsync=False)
        rec = new_recording(store)
        filler = fill(directory, leave_bytes=300 * 1024 + 5000)  # not a multiple of a block
        expected = b""
        with pytest.raises(OSError) as full:
            for i in range(1000):
                data = block(rec.recorded_position, stamp=i)
                rec.append(data, rec.recorded_position, 10 + i)
                expected += data
        assert full.value.errno == errno.ENOSPC
        acked = rec.recorded_position
        assert acked == len(expected) > 0
        assert os.path.getsize(rec._segment_path(0)) == acked  # nothing past the position
        # a second recording cannot even be created, and nothing is left half made
        with pytest.raises(OSError):
            new_recording(store).append(block(0), 0, 1)

        os.unlink(filler)  # space again: the same recording goes on at the same position
        for i in range(3):
            data = block(rec.recorded_position, stamp=2000 + i)
            rec.append(data, rec.recorded_position, 5000 + i)
            expected += data
        acked = rec.recorded_position

        filler = fill(directory)  # full to the last byte: stopping must not fail
        rec.stop(9000)
        assert rec.stop_position == acked
        os.unlink(filler)
        assert store.persist_stops() == 0
        assert os.path.exists(os.path.join(rec.directory, "stop.msgpack"))
        store.close(0)

        again = RecordingStore(os.path.join(directory, "archive"), fsync=False)
        got = again.get(rec.d.recording_id)
        assert (got.recorded_position, got.stop_position) == (acked, acked)
        assert read_all(got, acked) == expected
        again.close(0)
    finally:
        mount.__exit__(None, None, None)


def test_a_recorder_on_a_full_disk_keeps_blocks_in_the_image_until_they_fit(tmp_path: Path) -> None:
    try:
        mount = small_tmpfs(2 * 1024 * 1024)
        directory = mount.__enter__()
    except MountUnavailable as exc:
        pytest.skip(str(exc))
    try:
        store = RecordingStore(os.path.join(directory, "archive"), fsync=False)
        config = DriverConfig(directory=tmp_path / "driver", write_counters_file=False)
        payloads = [b"%06d" % i + b"." * 994 for i in range(1500)]  # 1.5 MB through 200 KB
        with Driver(config) as driver:
            sub = driver.add_subscription("aeron:ipc", 5)
            pub = driver.add_publication("aeron:ipc?term-length=256k", 5)
            recorder = Recorder(store, sub, source="ipc")
            assert pub.wait_until_connected(30)
            pub.offer(payloads[0])
            deadline = time.monotonic() + 30
            while not store.recordings:  # the recording is made while there is room
                recorder.do_work()
                sub.wait(0.01)
                assert time.monotonic() < deadline
            filler = fill(directory, leave_bytes=200_000)
            for payload in payloads[1:]:
                deadline = time.monotonic() + 30
                while pub.offer(payload) < 0:  # back pressure: the recorder cannot keep up
                    recorder.do_work()
                    if getattr(recorder, "append_failures", 0) and os.path.exists(filler):
                        os.unlink(filler)  # the disk was full; now there is room again
                    assert time.monotonic() < deadline, "the recorder never caught up"
                    sub.wait(0.01)
            (rec,) = store.recordings.values()
            deadline = time.monotonic() + 30
            while rec.recorded_position < pub.position:
                recorder.do_work()
                sub.wait(0.01)
                assert time.monotonic() < deadline
            assert recorder.append_failures >= 1, "the disk never filled up"
            assert not os.path.exists(filler)
            got = read_all(rec, rec.recorded_position)
            pub.close()
            recorder.close()
        assert recorded_payloads(got, rec.d.initial_term_id, rec.d.term_length) == payloads
        store.close(0)
    finally:
        mount.__exit__(None, None, None)

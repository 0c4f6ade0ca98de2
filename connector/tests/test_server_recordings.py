"""The recording store on disk: torn tails, boundaries, purge, reads that skip PAD frames."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.connector.server.framing import Framer
from aeron_spark.transport.archive import (
    NotFrameBoundaryError,
    PurgedError,
    Recording,
    RecordingStore,
)
from aeron_spark.transport.protocol.logbuffer import LogGeometry

TERM = 64 * 1024


def _fill(directory: str, seed: int, count: int = 400, term: int = TERM):
    rng = random.Random(seed)
    store = RecordingStore(directory, fsync=False)
    rec = store.create(7, 42, "test", 5, 5, 0, term, 1408, now_ns=1)
    framer = Framer(LogGeometry(term, 1408, 5), 42, 7, 0, max_block_bytes=3000)
    payloads = [rng.randbytes(rng.choice([10, 100, 1000, 3000])) for _ in range(count)]
    ends = []
    for p in payloads:
        for position, block in framer.frame([p]):
            rec.append(block, position, now_ns=position)
        ends.append(framer.position)
    return store, rec, payloads, ends


def _read_all(rec, start: int, limit: int) -> tuple[bytes, int]:
    out, position = bytearray(), start
    while position < limit:
        end, frames, _ts = rec.read(position, 5000, limit)
        assert end > position
        out += frames
        position = end
    return bytes(out), position


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), cut=st.floats(0.0, 1.0))
def test_recovery_keeps_every_complete_frame_and_cuts_the_torn_tail(tmp_path_factory, seed, cut):
    directory = str(tmp_path_factory.mktemp("rec"))
    store, rec, _payloads, ends = _fill(directory, seed)
    full, _ = _read_all(rec, 0, rec.recorded_position)
    store.close(now_ns=2)
    # the crash: the segment ends somewhere, possibly inside a frame; stop marker never written
    seg = [n for n in os.listdir(rec.directory) if n.endswith(".seg")][0]
    path = os.path.join(rec.directory, seg)
    raw = open(path, "rb").read()
    keep = int(len(raw) * cut)
    os.truncate(path, keep)
    os.unlink(os.path.join(rec.directory, "stop.msgpack"))
    again = RecordingStore(directory, fsync=False).get(rec.d.recording_id)
    recovered = again.recorded_position
    # every message complete on disk is kept; the torn frame, and the fragmented message it
    # was part of, are cut (message boundaries: message ends, and term starts after a PAD)
    term_starts = range(0, len(raw) + 1, TERM)
    assert recovered == max(b for b in [0, *ends, *term_starts] if b <= keep)
    data, end = _read_all(again, 0, recovered)
    assert end == recovered and full.startswith(data)
    assert again.stop_position == recovered  # recovered recordings are finished
    # the index file holds exactly the entries kept (sorted, all below the recovered end)
    index = open(os.path.join(rec.directory, "index"), "rb").read()
    kept = [int.from_bytes(index[i : i + 8], "little") for i in range(0, len(index), 16)]
    assert kept == [again.index.entry(i)[0] for i in range(len(again.index))]
    assert all(p < recovered for p in kept)
    assert kept == sorted(set(kept))


def test_positions_inside_frames_name_the_nearest_boundaries(tmp_path) -> None:
    _store, rec, _payloads, ends = _fill(str(tmp_path), 1, count=20)
    with pytest.raises(NotFrameBoundaryError) as info:
        rec.check_position(ends[3] + 32, rec.recorded_position, "start")
    assert info.value.before <= ends[3] + 32 < info.value.after
    rec.check_position(ends[3], rec.recorded_position, "start")  # a boundary is accepted


def test_purge_deletes_whole_segments_and_refuses_reads_below(tmp_path) -> None:
    store, rec, _payloads, ends = _fill(str(tmp_path), 2, count=50)
    assert rec.purge(ends[10]) == ends[10]
    with pytest.raises(PurgedError):
        rec.read(ends[5], 1000, rec.recorded_position)
    with pytest.raises(PurgedError):
        rec.check_position(ends[5], rec.recorded_position, "start")
    data, end = _read_all(rec, ends[10], rec.recorded_position)
    assert end == rec.recorded_position and data
    store.close(now_ns=3)
    assert RecordingStore(str(tmp_path), fsync=False).get(0).purged_position == ends[10]


def test_reads_skip_pad_frames_but_cover_their_positions(tmp_path) -> None:
    _store, rec, payloads, _ends = _fill(str(tmp_path), 3, count=300)  # several terms
    data, end = _read_all(rec, 0, rec.recorded_position)
    assert end == rec.recorded_position > 2 * TERM
    assert len(data) < end  # the PAD frames' bytes were not returned
    assert sum(len(p) for p in payloads) < len(data)


def _frame_positions(block: bytes, start: int) -> list[int]:
    out, i = [], 0
    while i < len(block):
        length = int.from_bytes(block[i : i + 4], "little", signed=True)
        out.append(start + i)
        i += (length + 31) & -32
    return out


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(4096, 200_000), min_size=1))
def test_a_message_has_the_same_timestamp_however_the_reads_are_cut(tmp_path_factory, seed, sizes):
    # A block's timestamp is the index time at its start; blocks end before the next index
    # entry, so every message gets the time indexed at or below its own position, whatever
    # block sizes a replay happens to use (re-reads give the same rows).
    store, rec, _payloads, ends = _fill(
        str(tmp_path_factory.mktemp("ts")), seed, count=600, term=1024 * 1024
    )
    assert len(rec.index) > 3
    limit = rec.recorded_position
    position, k = ends[len(ends) // 3] if seed % 2 else 0, 0
    while position < limit:
        end, frames, ts = rec.read(position, sizes[k % len(sizes)], limit)
        k += 1
        for p in _frame_positions(frames, position):
            assert ts == rec.time_at(p), (p, ts)
        position = end
    store.close(0)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    runs=st.lists(
        st.tuples(st.sampled_from([0, 1, 31, 32, 100, 116, 500, 2000]), st.integers(1, 300)),
        min_size=1,
        max_size=8,
    ),
    max_bytes=st.integers(4096, 40_000),
)
def test_runs_of_equal_frames_read_as_the_frame_by_frame_walk_reads_them(
    tmp_path_factory, monkeypatch, runs, max_bytes
):
    # reads take a run of equal-length frames at once (numpy); the blocks must be the ones the
    # frame-by-frame walk gives, term-end PAD frames and torn block ends included
    from aeron_spark.transport.archive import recordings

    store = RecordingStore(str(tmp_path_factory.mktemp("runs")), fsync=False)
    rec = store.create(7, 42, "test", 5, 5, 0, TERM, 1408, now_ns=1)
    framer = Framer(LogGeometry(TERM, 1408, 5), 42, 7, 0)
    for length, count in runs:
        for position, block in framer.frame([bytes([count % 256]) * length] * count):
            rec.append(block, position, now_ns=position)
    limit = rec.recorded_position

    def read_all() -> list[tuple[int, bytes, int]]:
        out, position = [], 0
        while position < limit:
            end, frames, ts = rec.read(position, max_bytes, limit)
            assert position < end <= limit
            out.append((end, frames, ts))
            position = end
        return out

    fast = read_all()
    with monkeypatch.context() as patch:  # undone after each example
        patch.setattr(recordings, "_uniform_prefix", lambda chunk, n: 0)
        slow = read_all()
    assert fast == slow
    store.close(0)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), picks=st.lists(st.integers(0, 10**9), min_size=2, max_size=8))
def test_a_read_only_open_of_a_range_reads_what_the_writer_reads(tmp_path_factory, seed, picks):
    # a read-only open loads only the index entries of its range (binary search in the file);
    # its blocks and timestamps must be the writer's, whatever the range
    store, rec, _payloads, ends = _fill(
        str(tmp_path_factory.mktemp("ro")), seed, count=800, term=1024 * 1024
    )
    bounds = [0] + ends
    for a, b in zip(picks, picks[1:], strict=False):
        start, end = sorted((bounds[a % len(bounds)], bounds[b % len(bounds)]))
        reader = Recording.open_read_only(rec.directory, start, end)
        try:
            position = start
            while position < end:
                got = reader.read(position, 20_000, end)
                assert got == rec.read(position, 20_000, end)
                position = got[0]
            assert len(reader.index) <= len(rec.index)
        finally:
            reader.close()
    store.close(0)


def test_without_fsync_new_recordings_descriptors_are_fsynced_off_the_callers_thread(
    tmp_path, monkeypatch
) -> None:
    """Issue 31 item 1: a recording's creation fsynced its descriptor and directory on the
    caller's thread (the server's event loop: 512 sessions' first publishes stalled it for
    seconds); without --fsync the descriptor is renamed in whole at once and fsynced by the
    store's syncer thread, so it survives a restart all the same; with --fsync as before."""
    threads: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the real fsync, noting the thread that called it
        threads.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = RecordingStore(str(tmp_path / "lazy"), fsync=False)
    threads.clear()  # opening wrote the id mark (its first block), at start: not a creation's
    for i in range(20):
        store.create(7, 100 + i, "test", 5, 5, 0, TERM, 1408, now_ns=1)
    caller = threading.current_thread().name
    deadline = time.monotonic() + 60
    while store.meta_syncer.synced < 20:  # the syncer's thread catches up
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert caller not in threads  # nothing on the caller's thread
    assert store.meta_syncer.failures == 0
    store.close(2)  # (stops are written on the caller's thread, as before)
    again = RecordingStore(str(tmp_path / "lazy"), fsync=False)
    assert sorted(again.recordings) == list(range(20))
    again.close(3)
    threads.clear()
    strict = RecordingStore(str(tmp_path / "strict"), fsync=True)
    strict.create(7, 1, "test", 5, 5, 0, TERM, 1408, now_ns=1)
    assert threads.count(caller) >= 2  # the descriptor and its directory, at once
    strict.close(2)
    assert strict.meta_syncer.synced == 0

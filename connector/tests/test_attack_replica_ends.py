"""Attacks on how a set of archive replicas bounds what a reader may read (issue 30): a sink's
target that fewer than ``minInSyncReplicas`` reachable archives can confirm, and the source's
cached message boundary of a recording whose bytes changed under it. Pure decisions, no archive
running (the real archives are in ``test_archive_replicas_interop.py``)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from aeron_spark.connector.archive_markers import END, Marker, agreed_end
from aeron_spark.connector.errors import ErrorCode, ReplicasUnavailableError
from aeron_spark.connector.options import parse_archive_source_options
from aeron_spark.connector.source import _partitions
from aeron_spark.connector.stores import Recording
from aeron_spark.connector.stores.archive import ArchiveStore
from aeron_spark.connector.stores.archive.source import message_end
from aeron_spark.connector.stores.replicas import ReplicaStore, in_sync_end
from aeron_spark.transport.archive.client.client import ReplayedBlock

A = "aeron:udp?endpoint=127.0.0.1:8010"
B = "aeron:udp?endpoint=127.0.0.1:8011"


def _options(archive: str):  # type: ignore[no-untyped-def]
    return parse_archive_source_options({"archive": archive, "streamId": "7"})


def test_a_target_fewer_archives_can_confirm_is_not_read_as_truncated() -> None:
    """A sink's target committed with ``minInSyncReplicas=2`` read through ``[A, B]``; the
    reader is at 4096 when A dies. B alone cannot confirm any batch, so the set's end falls to
    the recording's start: nothing more may be read, but nothing was truncated either. On the
    old code the next batch planned (another recording moved on) failed with
    ``PurgedError: ... was truncated to 0, below the offset 4096`` (failOnDataLoss's default),
    killing the query the replicas were meant to keep running."""
    o = _options(f"{A},{B}").source
    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    copy_b = Recording("t", store, 2, 7, 0, 3, 65536, 1408, 0, 0, 4096)
    copy_b = dataclasses.replace(copy_b, committed_only=True, alias="s", insync=2)
    end = in_sync_end([copy_b], [False], archives=2)
    assert end == 0  # B alone confirms nothing
    # what ReplicaSession.recordings gives for it (its end held back, B the only copy)
    target = dataclasses.replace(copy_b, end=end, holders=(B,), held=4096)
    other = Recording("o", store, 5, 7, 9, 3, 65536, 1408, 0, 0, 1024)
    recordings = {"t": target, "o": other}
    parts = _partitions(o, recordings, {"t": 4096, "o": 0}, {"t": 4096, "o": 1024})
    assert [(p.key, p.start, p.end) for p in parts] == [("o", 0, 1024)]


def _frame(position: int, flags: int, length: int = 64) -> bytes:
    head = struct.pack("<iBBhiiiiq", length, 0, flags, 1, position, 7, 9, 0, 0)
    return head.ljust(length, b"\1")


class _Held:
    """What an archive replays of one recording: ``data`` from its start (position 0)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.replays: list[tuple[int, int]] = []

    def replay(self, recording_id: int, lo: int, hi: int) -> list[ReplayedBlock]:
        self.replays.append((lo, hi))
        return [ReplayedBlock(lo, self.data[lo:hi], hi)]


def test_a_cached_message_boundary_is_not_trusted_once_the_bytes_there_changed() -> None:
    """The boundary cache is keyed by (control channel, recording id). The archive behind the
    channel answers for that id with other bytes (the recording truncated and extended again,
    or a fresh archive's catalog giving the id to another recording): the old boundary, 128,
    is now inside a fragmented message (BEGIN at 0, middle fragments after, no END yet). The
    old code walked on from 128, saw no BEGIN nor END and answered 128, inside the message:
    a reader would take [0, 128), half a message (and, on the next batch, drop the rest)."""
    channel = "aeron:udp?endpoint=127.0.0.1:65001"
    whole = _frame(0, 0xC0) + _frame(64, 0xC0)  # two unfragmented messages
    torn = _frame(0, 0x80) + _frame(64, 0x00) + _frame(128, 0x00)  # BEGIN, middle, middle
    # truncated and extended: the same identity, other bytes
    rec = Recording("k", None, 42, 7, 9, 3, 65536, 1408, 0, 0, 128)  # type: ignore[arg-type]
    assert message_end(_Held(whole), channel, rec, 128) == 128
    assert message_end(_Held(torn), channel, dataclasses.replace(rec, end=192), 192) == 0
    # a fresh catalog's recording 43 is another one (another session)
    rec = dataclasses.replace(rec, recording_id=43)
    assert message_end(_Held(whole), channel, rec, 128) == 128
    other = dataclasses.replace(rec, session_id=10, end=192)
    assert message_end(_Held(torn), channel, other, 192) == 0
    # the cache still serves a recording that grows
    grown = _Held(whole + _frame(128, 0xC0) + _frame(192, 0xC0))
    assert message_end(grown, channel, dataclasses.replace(rec, end=192), 192) == 192
    assert message_end(grown, channel, dataclasses.replace(rec, end=256), 256) == 256
    assert grown.replays == [(0, 192), (192, 256)]  # the second walk read what is new only


def _end(end: int, begin: int, digest: bytes) -> Marker:
    return Marker(END, "id", 1, 1, begin, 10, end - 64, end, digest, 2)


def test_an_end_two_copies_agree_on_is_found_past_a_copy_whose_batch_spans_it() -> None:
    """``minInSyncReplicas=2``; X and Y both end batch w at 1000 and went different ways after
    it (X to 3000, Y to 2500: neither acknowledged); Z, an old copy of another history, holds
    one batch over [0, 2000). 1000 is what two archives agree on. The old search walked down
    3000, 2500, 2000 and forgot there the beginnings it had learnt higher up (X's and Y's
    batches begin at 1000): at 2000 only Z's own begin, 0, was left, so the reader was given
    nothing (the recording's start)."""
    w = _end(1000, 0, b"w" * 8)
    x, y, z = _end(3000, 1000, b"x" * 8), _end(2500, 1000, b"y" * 8), _end(2000, 0, b"z" * 8)
    held = {0: {1000: w, 3000: x}, 1: {1000: w, 2500: y}, 2: {2000: z}}

    def marker_at(i: int, position: int) -> Marker | None:
        return held[i].get(position)

    copies = [(3000, x), (2500, y), (2000, z)]
    assert agreed_end(copies, 0, 2, marker_at) == (1000, [0, 1])


def test_a_planned_range_no_longer_confirmed_fails_as_replicas_unavailable() -> None:
    """``latestOffset`` planned a target's batch up to 4096 (A and B held its END, as its
    ``minInSyncReplicas=2`` needs); A died before ``planInputPartitions`` listed again, so the
    set's end is held back to 0 while B still holds 4096. The range cannot be confirmed now,
    nor was anything truncated: the error says so and is the replica set's coded
    SERVER_UNAVAILABLE one, failOnDataLoss or not. The old code raised PurgedError
    ('truncated to 0, below the offset 1024'), and with failOnDataLoss=false planned nothing
    for the recording: the batch would be committed up to 4096 without [1024, 4096)'s rows."""
    o = _options(f"{A},{B}").source
    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    target = Recording("t", store, 2, 7, 0, 3, 65536, 1408, 0, 0, 0)
    target = dataclasses.replace(
        target, committed_only=True, alias="s", insync=2, holders=(B,), held=4096
    )
    with pytest.raises(ReplicasUnavailableError) as info:
        _partitions(o, {"t": target}, {"t": 1024}, {"t": 4096})
    assert info.value.code == ErrorCode.SERVER_UNAVAILABLE
    assert "minInSyncReplicas=2" in str(info.value) and "4096" in str(info.value)
    assert info.value.details["archives"] == {
        A: "did not answer, or holds no copy",
        B: "holds a copy, cannot confirm it alone",
    }
    lenient = dataclasses.replace(o, fail_on_data_loss=False)
    with pytest.raises(ReplicasUnavailableError):
        _partitions(lenient, {"t": target}, {"t": 1024}, {"t": 4096})


def test_what_held_under_attack() -> None:
    """Attacks the rules withstood (they pass on the old code too; kept as their record)."""
    # the same batch and digest ending at two positions is two batches, not one agreed END
    here, there = _end(2000, 1000, b"d" * 8), _end(2064, 1064, b"d" * 8)
    held = {0: {2000: here}, 1: {2064: there}}
    got = agreed_end([(2000, here), (2064, there)], 0, 2, lambda i, p: held[i].get(p))
    assert got == (0, [0, 1])
    # a copy claiming minInSyncReplicas=1 does not lower what the others' markers ask
    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    primary = Recording("t", store, 1, 7, 0, 3, 65536, 1408, 0, 0, 4096)
    primary = dataclasses.replace(primary, committed_only=True, alias="s", insync=2)
    liar = dataclasses.replace(primary, recording_id=2, end=1024, insync=1)
    assert in_sync_end([primary, liar], [False, False], 2) == 1024
    assert in_sync_end([dataclasses.replace(liar, end=4096)], [False], 2) == 4096  # k=1 alone
    # a message whose END fragment ends exactly at the recorded end; an empty recording; a
    # recording that begins inside a message (a late join) and one that holds only its tail
    channel = "aeron:udp?endpoint=127.0.0.1:65002"
    rec = Recording("k", None, 7, 7, 9, 3, 65536, 1408, 0, 0, 128)  # type: ignore[arg-type]
    assert message_end(_Held(_frame(0, 0x80) + _frame(64, 0x40)), channel, rec, 128) == 128
    assert message_end(_Held(b""), channel, dataclasses.replace(rec, recording_id=8), 0) == 0
    late = dataclasses.replace(rec, recording_id=9, start=64, purged=64)
    tail = _Held(b"\0" * 64 + _frame(64, 0x00) + _frame(128, 0x40) + _frame(192, 0x80))
    assert message_end(tail, channel, late, 256) == 192
    only = dataclasses.replace(rec, recording_id=10, start=64, purged=64)
    assert message_end(_Held(b"\0" * 64 + _frame(64, 0x00)), channel, only, 128) == 64

"""The archive sink's BEGIN/END markers (sans-I/O): their encoding, how a frame is told to be a
marker (reserved value and magic), masking into padding, and the committed end of a tail."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from aeron_spark.connector.archive_markers import (
    BEGIN,
    END,
    MARKER_MAGIC,
    MARKER_RESERVED_VALUE,
    Marker,
    Tail,
    agreed_end,
    is_sink_target,
    markers_in,
    mask_markers,
    target_alias,
)
from aeron_spark.connector.formats import Geometry, iter_messages
from aeron_spark.connector.session.replay import ReplayBlock


def _frame(payload: bytes, position: int, reserved: int = 0) -> bytes:
    length = 32 + len(payload)
    head = struct.pack("<iBBhiiiiq", length, 0, 0xC0, 1, position, 7, 9, 0, reserved)
    return (head + payload).ljust((length + 31) & -32, b"\0")


def test_markers_are_found_by_reserved_value_and_magic_and_masked_into_padding() -> None:
    begin = Marker(BEGIN, "sink@abc", 5, 2, 0, 0)
    row_like = begin.encode()  # a row with the marker's bytes but not its reserved value
    frames = [
        _frame(begin.encode(), 0, MARKER_RESERVED_VALUE),
        _frame(b"row one", 0, 11),
        _frame(row_like, 0, 12),
        _frame(Marker(END, "sink@abc", 5, 2, 0, 2).encode(), 0, MARKER_RESERVED_VALUE),
    ]
    at, data = 0, b""
    for f in frames:  # positions written into the headers
        data += f[:8] + struct.pack("<i", at) + f[12:]
        at += len(f)
    found = markers_in(data, 1000)
    assert [(m.kind, m.identity, m.batch, m.partitions, m.rows) for m in found] == [
        (BEGIN, "sink@abc", 5, 2, 0),
        (END, "sink@abc", 5, 2, 2),
    ]
    assert found[0].position == 1000 and found[1].end_position == 1000 + len(data)
    masked, count = mask_markers(data)
    assert count == 2 and len(masked) == len(data)
    rows = list(iter_messages([ReplayBlock(0, masked, 0, len(masked))], Geometry(0, 1 << 16)))
    assert [(bytes(m.payload), m.reserved_value) for m in rows] == [
        (b"row one", 11),
        (row_like, 12),
    ]
    assert mask_markers(masked) == (masked, 0)


def test_committed_end_of_a_tail() -> None:
    end = Marker(END, "s", 1, 1, 64, 3, position=512, end_position=640)
    assert Tail(end, 640).committed_end == 640 and not Tail(end, 640).torn
    torn = Marker(BEGIN, "s", 2, 1, 640, 0, position=640, end_position=768)
    assert Tail(torn, 5000).committed_end == 640 and Tail(torn, 5000).torn
    assert Tail(None, 100).committed_end == 100


def test_target_alias_names_the_sink_safely() -> None:
    alias = target_alias("orders|x=1")
    assert "|" not in alias and "=" not in alias
    assert is_sink_target(f"aeron:udp?endpoint=h:1|alias={alias}")
    assert not is_sink_target("aeron:udp?endpoint=h:1|alias=other")


def test_an_end_marker_carries_a_digest_and_older_markers_decode_without() -> None:
    """The END's digest survives encode/decode and takes part in equality (two appends of a
    batch whose rows differ in order only), as does the commit's minInSyncReplicas (insync); a
    marker of the format before them (the two bytes after the kind zero) still decodes, with no
    digest and insync 1; a digest of the wrong length, or flags this version does not know, are
    refused."""
    end = Marker(END, "sink@abc", 5, 2, 64, 7, digest=b"\x01" * 8)
    payload = end.encode()
    got = Marker.decode(payload, 0, 0)
    assert got is not None and got.digest == b"\x01" * 8 and got.identity == "sink@abc"
    assert got != Marker.decode(replace(end, digest=b"\x02" * 8).encode(), 0, 0)
    old = Marker(END, "sink@abc", 5, 2, 64, 7).encode()
    assert old[len(MARKER_MAGIC) + 1] == 0  # the flags byte: what the older format had
    assert Marker.decode(old, 0, 0) == Marker(END, "sink@abc", 5, 2, 64, 7, 0, 0)
    with pytest.raises(ValueError, match="8 bytes"):
        replace(end, digest=b"\x01" * 4).encode()
    older = bytearray(old)
    older[len(MARKER_MAGIC) + 2] = 0  # insync: 0 before it existed, read as 1
    assert Marker.decode(bytes(older), 0, 0) == Marker(END, "sink@abc", 5, 2, 64, 7, 0, 0)
    three = Marker.decode(replace(end, insync=3).encode(), 0, 0)
    assert three is not None and three.insync == 3
    with pytest.raises(ValueError, match="insync"):
        replace(end, insync=0).encode()
    unknown = bytearray(payload)
    unknown[len(MARKER_MAGIC) + 1] = 0x80
    assert Marker.decode(bytes(unknown), 0, 0) is None


def _end(end: int, begin: int, digest: bytes, insync: int = 2) -> Marker:
    return Marker(END, "id", 1, 1, begin, 10, end - 64, end, digest, insync)


def test_agreed_end_is_the_furthest_end_enough_copies_hold_the_same() -> None:
    """Copies of a sink's target: (committed end, the END there). ``marker_at`` answers from
    what each copy holds further back (what a read of it would find)."""
    w = _end(1000, 500, b"w" * 8)
    x, y = _end(2000, 1000, b"x" * 8), _end(2000, 1000, b"y" * 8)  # one batch, two orders
    held = {0: {1000: w, 2000: x}, 1: {1000: w, 2000: y}, 2: {1000: w, 2000: y}}
    reads: list[tuple[int, int]] = []

    def marker_at(i: int, position: int) -> Marker | None:
        reads.append((i, position))
        return held[i].get(position)

    # every copy ends at the same END: no read
    assert agreed_end([(2000, y), (2000, y)], 0, 2, marker_at) == (2000, [0, 1])
    assert reads == []
    # an old primary (first) holds another batch there: the two that agree
    assert agreed_end([(2000, x), (2000, y), (2000, y)], 0, 2, marker_at) == (2000, [1, 2])
    # the old primary and one replica disagree: the END before, which both hold
    assert agreed_end([(2000, x), (2000, y)], 0, 2, marker_at) == (1000, [0, 1])
    # a copy behind: the copy further on is read where it ends
    reads.clear()
    assert agreed_end([(2000, y), (1000, w)], 0, 2, marker_at) == (1000, [0, 1])
    assert reads == [(0, 1000)]
    # one copy, two needed: nothing above the start; ``below`` bounds the search
    assert agreed_end([(2000, y)], 0, 2, marker_at) == (0, [0])
    assert agreed_end([(2000, y), (2000, y)], 0, 2, marker_at, below=1000) == (1000, [0, 1])
    # minInSyncReplicas 1: the END most copies hold (ties: preference order)
    assert agreed_end([(2000, x), (2000, y), (2000, y)], 0, 1, marker_at) == (2000, [1, 2])
    assert agreed_end([(2000, x), (2000, y)], 0, 1, marker_at) == (2000, [0])

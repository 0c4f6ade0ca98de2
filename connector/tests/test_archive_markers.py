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
    MAX_EPOCH,
    OPENING_BATCH,
    Marker,
    Tail,
    agreed_end,
    is_sink_target,
    markers_in,
    mask_markers,
    newest,
    next_epoch,
    target_alias,
)
from aeron_spark.connector.errors import ErrorCode, LimitExceededError
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


def test_a_markers_epoch_and_owner_round_trip_and_older_markers_read_as_epoch_0() -> None:
    """The epoch (and the archive id of the primary that wrote the marker) follow the digest
    under flag 2; an epoch opening is flag 4 (with 2). A marker without them (every marker
    written before epochs) reads as epoch 0, owner 0; what would make a marker claim an epoch
    it does not carry is refused."""
    end = Marker(END, "s", 5, 2, 64, 7, digest=b"\x01" * 8, insync=2, epoch=3, owner=-77)
    assert Marker.decode(end.encode(), -1, -1) == end
    no_digest = replace(end, digest=b"")
    assert Marker.decode(no_digest.encode(), -1, -1) == no_digest
    opening = Marker(END, "s", OPENING_BATCH, 0, 64, 0, epoch=4, owner=9, opens_epoch=True)
    assert Marker.decode(opening.encode(), -1, -1) == opening
    assert Marker.decode(replace(opening, kind=BEGIN).encode(), -1, -1).opens_epoch  # type: ignore[union-attr]
    old = Marker.decode(replace(end, epoch=0, owner=5).encode(), -1, -1)  # owner only with epoch
    assert old is not None and (old.epoch, old.owner, old.opens_epoch) == (0, 0, False)
    assert old == replace(end, epoch=0, owner=0)
    for bad in (replace(end, epoch=-1), replace(opening, epoch=0)):
        with pytest.raises(ValueError, match="epoch"):
            bad.encode()
    flags_at = len(MARKER_MAGIC) + 1
    payload = bytearray(opening.encode())
    payload[flags_at] = 4  # an opening without its epoch
    assert Marker.decode(bytes(payload), -1, -1) is None
    payload[flags_at] = 8  # a flag this version does not know
    assert Marker.decode(bytes(payload), -1, -1) is None
    at = len(MARKER_MAGIC) + struct.calcsize("<BBBxiqqq") + 8  # after the digest: the epoch
    zero = bytearray(end.encode())
    zero[at : at + 8] = bytes(8)  # flag 2 with epoch 0
    assert Marker.decode(bytes(zero), -1, -1) is None
    short = end.encode()[: at + 4]  # flag 2 and no room for the epoch
    assert Marker.decode(short, -1, -1) is None


def _e(end: int, begin: int, digest: bytes, epoch: int, owner: int, opens: bool = False) -> Marker:
    batch = OPENING_BATCH if opens else 1
    return Marker(END, "id", batch, 1, begin, 10, end - 64, end, digest, 2, epoch, owner, opens)


def test_the_newest_history_is_elected_and_an_epoch_goes_on_only_when_every_archive_agrees() -> (
    None
):
    """The hole markers alone could not close (``minInSyncReplicas=2``, archives a, b, c): a
    wrote batch 1 under epoch 1 (x) and died before any copy; b was elected, opened epoch 2 on
    b and c and wrote batch 1 again (y, acknowledged); c is gone and a is back. Fewer than two
    archives hold y, but y's epoch is higher: b's history is the newest, whatever the ends
    (the opening moves b's batch; with older markers, or an opening of the same size as a
    batch, the ends may also be equal or a's further on)."""
    a_id, b_id = 11, 22
    x = _e(2000, 1000, b"x" * 8, 1, a_id)
    y = _e(2128, 1128, b"y" * 8, 2, b_id)
    assert newest([(2000, x), (2128, y)]) == [1]
    assert newest([(2000, x), (2000, replace(y, end_position=2000))]) == [1]
    assert newest([(9000, replace(x, end_position=9000)), (2128, y)]) == [1]
    assert newest([(-1, None), (2128, y), (2128, y)]) == [1, 2]  # ties: preference order
    w = _e(1000, 500, b"w" * 8, 0, 0)  # older markers only: agreed_end decides
    assert newest([(1000, w), (1000, w)]) == [] == newest([(-1, None)])
    # the epoch the commit writes under, and whether it opens it first
    everyone = [(2128, y), (2128, y), (2128, y)]
    assert next_epoch(everyone, 0, b_id) == (2, False)  # the steady state: no opening
    assert next_epoch(everyone, 1, a_id) == (3, True)  # another primary
    assert next_epoch([(2128, y), (-1, None), (2128, y)], 0, b_id) == (3, True)  # one away
    assert next_epoch([(2128, y), (2000, x), (2128, y)], 0, b_id) == (3, True)  # one differs
    assert next_epoch([(2128, y), (1000, w), (2128, y)], 0, b_id) == (3, True)  # one behind
    assert next_epoch([(2128, y), (2128, y), (2128, replace(y, epoch=5))], 0, b_id) == (6, True)
    assert next_epoch([(-1, None), (-1, None)], 0, a_id) == (1, True)  # a new sink
    assert next_epoch([(1000, w), (1000, w)], 0, 0) == (1, True)  # older markers


def test_agreed_end_an_older_epochs_end_where_a_newer_one_ends_does_not_count() -> None:
    """Where copies end a batch at the same position under two epochs, only the newer epoch's
    copies may count: the older, even held by ``minInSyncReplicas`` copies, is not read."""
    w = _e(1000, 500, b"w" * 8, 1, 11)
    x, y = _e(2000, 1000, b"x" * 8, 1, 11), _e(2000, 1000, b"y" * 8, 2, 22)
    held = {0: {1000: w, 2000: x}, 1: {1000: w, 2000: x}, 2: {1000: w, 2000: y}}

    def marker_at(i: int, position: int) -> Marker | None:
        return held[i].get(position)

    copies = [(2000, x), (2000, x), (2000, y)]
    assert agreed_end(copies, 0, 2, marker_at) == (1000, [0, 1, 2])
    assert agreed_end(copies, 0, 1, marker_at) == (2000, [2])
    assert agreed_end([(2000, y), (2000, y), (2000, x)], 0, 2, marker_at) == (2000, [0, 1])


def test_a_stray_opening_of_an_epoch_another_primary_numbered_alike_is_not_elected() -> None:
    """Two primaries can number an epoch alike (``minInSyncReplicas=2``, archives a, b, c):
    a appended batch 2 under epoch 4 (x, never acknowledged: cut off before its copies), then,
    elected again, the opening of epoch 5, and was cut off again before the opening reached a
    second archive (so it was not cut back). b, elected without a, saw epoch 4 as the highest,
    opened epoch 5 on b and c and wrote batch 2 again (y, acknowledged, the same size). a is
    back: a ends at the same position under epoch 5 as b and c. Main elected a (``archive``
    first among the ties): y was cut off b and c and x copied in its place."""
    a_id, b_id = 11, 22
    stray = _e(2256, 2000, b"o" * 8, 5, a_id, opens=True)  # after x (1000..2000), epoch 4
    y = _e(2256, 1256, b"y" * 8, 5, b_id)  # after b's opening (1000..1256), epoch 5
    assert newest([(2256, stray), (2256, y), (2256, y)]) == [1, 2]  # main: [0, 1, 2]
    # a further on (x longer than y): main elected a by its end
    far = replace(stray, begin_position=2100, position=2300 - 64, end_position=2300)
    assert newest([(2300, far), (2256, y), (2256, y)]) == [1, 2]  # main: [0]
    # b's epoch only opened (the commit failed before batch 2), held by b and c: established
    opened = _e(1256, 1000, b"p" * 8, 5, b_id, opens=True)
    assert newest([(2300, far), (1256, opened), (1256, opened)]) == [1, 2]  # main: [0]
    # c gone: b's bare opening is held by one archive of two, nothing tells the claims apart
    assert newest([(2300, far), (1256, opened), (-1, None)]) == [0]
    # minInSyncReplicas 1: every opening is established; the furthest, as before
    one = replace(opened, insync=1)
    assert newest([(2300, replace(far, insync=1)), (1256, one), (1256, one)]) == [0]
    # the promoted b goes on under a new epoch, opened first
    assert next_epoch([(2256, stray), (2256, y), (2256, y)], 1, b_id) == (6, True)


def test_an_end_of_the_last_epoch_an_int64_takes_fails_the_election_coded() -> None:
    """A writer of the archive's own appends an END of epoch 2**63 - 1 (the highest a marker
    holds): main's next epoch was 2**63 and every commit failed with a bare struct.error packing
    it; now a coded LIMIT_EXCEEDED says which epoch and what to do."""
    forged = _e(2256, 2000, b"f" * 8, MAX_EPOCH, 666)
    assert Marker.decode(forged.encode(), -1, -1) is not None  # a marker like any other
    with pytest.raises(LimitExceededError, match=str(MAX_EPOCH)) as info:
        next_epoch([(2256, forged), (1000, None)], 1, 22)
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED

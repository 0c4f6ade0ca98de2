"""Rows from recorded frames: the vectorised fixed-size path and the general path agree."""

from __future__ import annotations

import pytest

from aeron_spark.connector.client import ReplayBlock
from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.formats import (
    Geometry,
    _uniform_block_batch,
    arrow_schema,
    batches_from_blocks,
    iter_messages,
)
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.protocol.term import TermAppender

INITIAL_TERM_ID = 2**31 - 2  # the term id wraps inside the test


def record(
    payloads: list[bytes], term_length: int = 64 * 1024, mtu: int = 1408
) -> tuple[bytes, Geometry]:
    """Frames exactly as a recording holds them (PAD frames removed, as the server replays)."""
    geo = LogGeometry(term_length, mtu, INITIAL_TERM_ID)
    terms = [memoryview(bytearray(term_length)) for _ in range(3)]
    appender = TermAppender(geo, terms, 77, 10, INITIAL_TERM_ID, 0)
    out = bytearray()
    for i, payload in enumerate(payloads):
        before_term, before_offset = appender.term_id, appender.term_offset
        appender.append(payload, reserved_value=i)
        if appender.term_id != before_term:
            before_offset = 0
        part = appender.partition
        out += terms[part][before_offset : appender.term_offset]
    return bytes(out), Geometry(INITIAL_TERM_ID, term_length)


def test_fixed_size_block_takes_the_vectorised_path_and_matches() -> None:
    payloads = [bytes([i % 251]) * 84 for i in range(3000)]  # 116-byte frames, several terms
    data, geo = record(payloads)
    block = ReplayBlock(0, data, 1_700_000_000_000_000_000, len(data))
    fast = _uniform_block_batch(block, 5, geo, False, arrow_schema(False))
    assert fast is not None
    slow = list(iter_messages([block], geo))
    assert fast.column("value").to_pylist() == [bytes(m.payload) for m in slow] == payloads
    assert fast.column("position").to_pylist() == [m.position for m in slow]
    assert fast.column("reserved_value").to_pylist() == list(range(3000))
    assert set(fast.column("recording_id").to_pylist()) == {5}


def test_mixed_and_fragmented_messages_across_blocks() -> None:
    payloads = [bytes([i % 7]) * (1 + (i * 389) % 5000) for i in range(400)]
    data, geo = record(payloads)
    cut = 0  # the end of a BEGIN-only fragment: the message spans the two blocks
    while not (data[cut + 5] == 0x80 and cut > 5000):
        cut += (int.from_bytes(data[cut : cut + 4], "little") + 31) & -32
    cut += (int.from_bytes(data[cut : cut + 4], "little") + 31) & -32
    blocks = [ReplayBlock(0, data[:cut], 1, cut), ReplayBlock(cut, data[cut:], 2, len(data))]
    batches = batches_from_blocks(blocks, 1, geo, False)
    got = [v for b in batches for v in b.column("value").to_pylist()]
    assert got == payloads


def test_range_starting_inside_a_fragmented_message_is_an_error() -> None:
    data, geo = record([b"x" * 3000])
    with pytest.raises(ControlProtocolError, match="starts inside"):
        list(iter_messages([ReplayBlock(0, data[1408:], 0, len(data))], geo))
    with pytest.raises(ControlProtocolError, match="ends inside"):
        list(iter_messages([ReplayBlock(0, data[:1408], 0, 1408)], geo))


def _frames_of(data: bytes) -> list[int]:
    """Byte offsets of the messages of ``data`` (their first frames; recorded frames, PAD
    removed), and its end."""
    offsets, at = [], 0
    while at < len(data):
        if data[at + 5] & 0x80:  # BEGIN
            offsets.append(at)
        at += (int.from_bytes(data[at : at + 4], "little") + 31) & -32
    return [*offsets, len(data)]


def _blocks(data: bytes, cuts: list[int], first_ts: int) -> list[ReplayBlock]:
    bounds = [0, *cuts, len(data)]
    return [
        ReplayBlock(a, data[a:b], first_ts + i, b)
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))
    ]


@pytest.mark.parametrize("rows_per_batch", [1, 250, 1000, 65536])
def test_uniform_blocks_are_gathered_into_batches_with_the_same_rows(rows_per_batch: int) -> None:
    """Consecutive fixed-size blocks become batches of up to rows_per_batch rows; a block of
    other sizes or fragments in between ends a batch; the rows (values, positions, timestamps
    of each block, reserved values) are the general path's, in order."""
    uniform = [bytes([i % 251]) * 84 for i in range(1200)]
    other = [bytes([i % 13]) * 40 for i in range(300)]  # another fixed size
    mixed = [b"y" * (1 + (i * 389) % 3000) for i in range(50)]  # sizes and fragments
    payloads = uniform + mixed + other + uniform[:400]
    data, geo = record(payloads)
    frames = _frames_of(data)
    # blocks of 100 frames in the uniform runs, one block for the mixed part
    starts = [frames[i] for i in range(100, 1200, 100)]
    mixed_end = frames[1200 + 50]
    starts += [frames[1200], mixed_end]
    starts += [frames[i] for i in range(1250 + 100, len(payloads), 100)]
    blocks = _blocks(data, sorted(set(starts)), 1_000_000)
    batches = list(batches_from_blocks(blocks, 9, geo, False, rows_per_batch))
    general = list(iter_messages(blocks, geo))
    assert [v for b in batches for v in b.column("value").to_pylist()] == payloads
    assert [p for b in batches for p in b.column("position").to_pylist()] == [
        m.position for m in general
    ]
    assert [t.value for b in batches for t in b.column("timestamp")] == [
        m.timestamp_ns // 1000 for m in general
    ]
    assert [r for b in batches for r in b.column("reserved_value").to_pylist()] == list(
        range(len(payloads))
    )
    assert all(b.num_rows <= max(rows_per_batch, 100) for b in batches)
    if rows_per_batch == 65536:  # the 1,200 uniform rows are one batch, not 12
        assert batches[0].num_rows == 1200


def test_gathered_text_batch_fails_on_invalid_utf8() -> None:
    payloads = ["é".encode() * 42] * 300
    payloads[250] = b"\xff" * 84
    data, geo = record(payloads)
    frames = _frames_of(data)
    blocks = _blocks(data, [frames[100], frames[200]], 0)
    with pytest.raises(Exception, match="UTF-8|utf8|Invalid"):
        list(batches_from_blocks(blocks, 1, geo, True))

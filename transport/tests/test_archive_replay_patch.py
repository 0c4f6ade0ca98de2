"""A replayed block's frames get the recording's session and stream ids written back (so a
re-read of a recording holds the same bytes whatever replay session carried it): blocks of
one frame length at once (numpy), any other block frame by frame, a final PAD frame too."""

from __future__ import annotations

import struct

from aeron_spark.transport.archive.client import patch_frames
from aeron_spark.transport.protocol.frames import DataFrame


def _frame(payload_length: int, session: int = 77, stream: int = 1101) -> bytes:
    return DataFrame(0, session, stream, 5, bytes([payload_length % 251]) * payload_length).encode()


def _pad(length: int) -> bytes:
    head = struct.pack("<iBBhiiiiq", length, 0, 0xC0, 0, 0, 77, 1101, 5, 0)
    return head + bytes(length - len(head))


def _ids(block: bytes) -> list[tuple[int, int]]:
    out, at = [], 0
    while at < len(block):
        length, session, stream = struct.unpack_from("<i8xii", block, at)
        out.append((session, stream))
        at += (length + 31) & -32
    return out


def test_a_block_of_equal_frames_is_patched_at_once() -> None:
    for count in (1, 15, 16, 400):  # frame by frame below 16 frames, numpy from 16
        block = bytearray(_frame(116) * count)
        patch_frames(block, -5, 2101)
        assert _ids(bytes(block)) == [(-5, 2101)] * count
    block = bytearray(_frame(116) * 40)
    original = bytes(block)
    patch_frames(block, -5, 2101)
    assert _ids(bytes(block)) == [(-5, 2101)] * 40
    # nothing but the two ids changed
    for at in range(0, len(block), 160):
        assert block[at : at + 12] == original[at : at + 12]
        assert block[at + 20 : at + 160] == original[at + 20 : at + 160]


def test_mixed_lengths_and_a_final_pad_are_patched_frame_by_frame() -> None:
    block = bytearray(_frame(116) + _frame(3000) + _frame(1) + _pad(256))
    patch_frames(block, 9, None)  # the stream id is left as replayed
    assert _ids(bytes(block)) == [(9, 1101)] * 4
    equal_then_pad = bytearray(_frame(116) * 30 + _pad(160))  # same lengths but for the pad
    patch_frames(equal_then_pad, 9, 8)
    assert _ids(bytes(equal_then_pad)) == [(9, 8)] * 31


def test_nothing_to_patch_leaves_the_block() -> None:
    block = bytearray(_frame(116) * 2)
    original = bytes(block)
    patch_frames(block, None, None)
    assert bytes(block) == original

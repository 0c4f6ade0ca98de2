"""The wire format's walks (``frames.walk``, ``uniform_run``, ``uniform_block``) against a plain
frame-by-frame reading of the same bytes: every reader of recorded frames (the replay formats,
the server's scan, the archive's recordings) takes its equal-length runs from them (issue 29)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.transport.protocol import frames as f

_FRAME = st.tuples(
    st.sampled_from([32, 33, 40, 64, 100]),  # frame length
    st.sampled_from([0xC0, 0x80, 0x40, 0x00, 0xE0]),  # flags
    st.sampled_from([f.FrameType.DATA, f.FrameType.PAD, 0x101]),  # type (0x101: low byte DATA)
    st.sampled_from([0, 0, 0, 1]),  # version
)


def _frames(spec: list[tuple[int, int, int, int]]) -> bytes:
    out = bytearray()
    for length, flags, ftype, version in spec:
        aligned = f.align(length)
        frame = bytearray(aligned)
        f.DATA_HEADER.pack_into(frame, 0, length, version, flags, ftype, len(out), 7, 9, 3, 0)
        frame[32:length] = bytes(range(length - 32))
        out += frame
    return bytes(out)


def _reference_run(spec: list[tuple[int, int, int, int]], start: int, unfragmented: bool) -> int:
    length = spec[start][0]
    count = 0
    for frame_length, flags, ftype, version in spec[start:]:
        if f.align(frame_length) != f.align(length):
            break  # the walk reads at a stride of the first frame's aligned length
        whole = flags == 0xC0 if unfragmented else True
        if frame_length != length or ftype != f.FrameType.DATA or version != 0 or not whole:
            break
        count += 1
    return count


@settings(max_examples=100, deadline=None)
@given(st.lists(_FRAME, min_size=1, max_size=40), st.data())
def test_uniform_run_counts_what_a_frame_by_frame_walk_counts(spec, data) -> None:  # type: ignore[no-untyped-def]
    buf = _frames(spec)
    start = data.draw(st.integers(0, len(spec) - 1))
    offset = sum(f.align(length) for length, *_ in spec[:start])
    unfragmented = data.draw(st.booleans())
    got = f.uniform_run(buf, offset, spec[start][0], unfragmented=unfragmented)
    assert got == _reference_run(spec, start, unfragmented)


@settings(max_examples=60, deadline=None)
@given(st.lists(_FRAME, min_size=1, max_size=30))
def test_walk_yields_every_frame_of_whole_frames(spec) -> None:  # type: ignore[no-untyped-def]
    buf = _frames(spec)
    walked = list(f.walk(buf))
    expected = []
    at = 0
    for length, flags, ftype, _version in spec:
        expected.append((at, f.align(length), length, flags, ftype & 0xFFFF))
        at += f.align(length)
    assert walked == expected


def test_uniform_block_gives_headers_and_payloads_of_a_block_of_whole_equal_messages() -> None:
    buf = _frames([(40, 0xC0, f.FrameType.DATA, 0)] * 5)
    uniform = f.uniform_block(buf)
    assert uniform is not None
    headers, payloads = uniform
    assert headers.dtype == f.DATA_HEADER_DTYPE
    assert list(headers["term_offset"]) == [0, 64, 128, 192, 256]
    assert payloads.shape == (5, 8)
    assert bytes(payloads[3]) == bytes(range(8))
    # one fragment, a PAD, another length, or a torn tail: not uniform
    assert f.uniform_block(_frames([(40, 0xC0, 1, 0)] * 4 + [(40, 0x80, 1, 0)])) is None
    assert f.uniform_block(_frames([(40, 0xC0, 1, 0)] * 4 + [(40, 0xC0, 0, 0)])) is None
    assert f.uniform_block(_frames([(40, 0xC0, 1, 0)] * 4 + [(33, 0xC0, 1, 0)])) is None
    assert f.uniform_block(buf[:-32]) is None
    assert f.uniform_block(np.frombuffer(buf, np.uint8)) is not None


def test_a_run_costs_its_own_frames_not_the_rest_of_the_block(monkeypatch) -> None:
    """Taking every message of a block of alternating lengths (no two equal neighbours) reads
    each frame a bounded number of times: one window over the rest of the block at every
    message made a scan of such data quadratic (4 MiB blocks of them: minutes, the commit worker
    stalled for every client; ``connector/tests/test_attack_scan_cost.py``)."""
    n = 4_000
    block = _frames([(32 if i % 2 else 64, 0xC0, f.FrameType.DATA, 0) for i in range(n)])
    words_read = 0
    real = np.frombuffer

    def counting(*args, **kwargs):
        nonlocal words_read
        out = real(*args, **kwargs)
        words_read += out.size
        return out

    monkeypatch.setattr(f.np, "frombuffer", counting)
    offset = taken = 0
    while offset < len(block):
        length = 32 if taken % 2 else 64
        run = f.uniform_run(block, offset, length)
        assert run == 1
        offset += f.align(length)
        taken += 1
    assert taken == n
    # 16 frames of 16 words at most per message; the old walk read ~n**2 / 2 frames' words
    assert words_read <= n * 16 * 16, words_read

"""Server-side framing produces what an Aeron publication would have written, deterministically."""

from __future__ import annotations

import random

from aeron_spark.connector.server.framing import Framer
from aeron_spark.transport.protocol.frames import FrameType
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.protocol.term import FragmentAssembler, Header, read_term


def _read_back(geometry: LogGeometry, blocks: list[tuple[int, bytes]], start: int, end: int):
    """Lay the blocks into terms and read them with the transport's own term reader."""
    terms: dict[int, bytearray] = {}
    for position, block in blocks:
        index = position >> geometry.shift
        term = terms.setdefault(index, bytearray(geometry.term_length))
        offset = geometry.term_offset(position)
        assert offset + len(block) <= geometry.term_length, "a block crossed a term boundary"
        term[offset : offset + len(block)] = block
    out: list[tuple[bytes, int, int]] = []
    assembler = FragmentAssembler(lambda p, h: out.append((bytes(p), h.reserved_value, h.position)))
    position = start
    while position < end:
        index = position >> geometry.shift
        header = Header(geometry.initial_term_id, geometry.shift)
        _, new_offset = read_term(
            memoryview(terms[index]), geometry.term_offset(position), assembler, 1 << 30, header
        )
        position = (index << geometry.shift) + new_offset
    assert position == end
    return out


def test_frames_read_back_with_padding_and_fragmentation() -> None:
    rng = random.Random(5)
    geometry = LogGeometry(term_length=64 * 1024, mtu=1408, initial_term_id=77)
    payloads = [rng.randbytes(rng.choice([0, 1, 100, 1376, 1377, 5000, 8000])) for _ in range(300)]
    rvs = [rng.randrange(-(2**63), 2**63) for _ in payloads]
    framer = Framer(
        geometry, session_id=1234, stream_id=10, position=3 * 64 * 1024 - 96, max_block_bytes=10_000
    )
    start = framer.position
    blocks = list(framer.frame(payloads, rvs))
    assert blocks[0][0] == start
    for (p1, b1), (p2, _) in zip(blocks, blocks[1:], strict=False):
        assert p1 + len(b1) == p2
    got = _read_back(geometry, blocks, start, framer.position)
    assert [g[0] for g in got] == payloads
    assert [g[1] for g in got] == rvs
    # a PAD frame was written at a term end
    pads = [
        b
        for p, b in blocks
        if b[6] == FrameType.PAD
        or any(
            b[i + 6] == FrameType.PAD
            for i in range(0, len(b), 32)
            if int.from_bytes(b[i : i + 4], "little") > 0 and b[i + 6] == FrameType.PAD
        )
    ]
    assert pads


def test_framing_is_deterministic_so_a_commit_can_resume() -> None:
    geometry = LogGeometry(term_length=64 * 1024, mtu=4096, initial_term_id=0)
    payloads = [bytes([i % 256]) * (i * 37 % 9000) for i in range(200)]
    a = b"".join(b for _, b in Framer(geometry, 5, 6, 0).frame(payloads))
    b = b"".join(b for _, b in Framer(geometry, 5, 6, 0, max_block_bytes=5000).frame(payloads))
    assert a == b


def test_large_messages_share_blocks_with_the_bytes_of_one_at_a_time() -> None:
    """Fragmented messages go into the block holding the messages before them (one write for
    many large messages, not one each: issue 34), framed byte for byte as one at a time."""
    rng = random.Random(34)
    geometry = LogGeometry(term_length=1 << 20, mtu=8192, initial_term_id=9)
    payloads = [
        rng.randbytes(rng.choice([65536, 65536, 20_000, 100, 8160, 8161])) for _ in range(60)
    ]
    framer = Framer(geometry, 5, 6, 0)
    blocks = list(framer.frame(payloads))
    single = Framer(geometry, 5, 6, 0)
    one_at_a_time = [block for payload in payloads for block in single.frame([payload])]
    assert _joined(blocks, 0) == _joined(one_at_a_time, 0)
    assert framer.position == single.position > sum(map(len, payloads))
    large = sum(len(p) > geometry.max_payload_length for p in payloads)
    assert len(blocks) <= 4 < large  # a block per term (and the PAD ending it), not per message
    got = _read_back(geometry, blocks, 0, framer.position)
    assert [g[0] for g in got] == payloads


def _joined(blocks: list[tuple[int, bytes]], start: int) -> bytes:
    out = bytearray()
    for position, block in blocks:
        assert position == start + len(out), "blocks are contiguous"
        out += block
    return bytes(out)


def test_equal_length_payloads_framed_with_numpy_give_the_same_bytes() -> None:
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=60, deadline=None)
    @given(
        length=st.integers(0, 3000),
        count=st.integers(1, 400),
        start_frames=st.integers(0, 5000),
        initial=st.integers(-(2**31), 2**31 - 1),
        block=st.sampled_from([1024, 4096, 1 << 20]),
    )
    def check(length: int, count: int, start_frames: int, initial: int, block: int) -> None:
        geometry = LogGeometry(64 * 1024, 1408, initial)
        start = start_frames * 32
        rng = np.random.default_rng(length * 7919 + count)
        rows = rng.integers(0, 256, size=(count, length), dtype=np.uint8)
        rvs = rng.integers(-(2**63), 2**63 - 1, size=count, dtype=np.int64)
        each = Framer(geometry, 5, 6, start, max_block_bytes=block)
        uniform = Framer(geometry, 5, 6, start, max_block_bytes=block)
        expected = _joined(
            list(each.frame([r.tobytes() for r in rows], [int(v) for v in rvs])), start
        )
        got_blocks = list(uniform.frame(rows, rvs))
        assert _joined(got_blocks, start) == expected
        assert uniform.position == each.position
        for position, data in got_blocks:  # never across a term
            assert geometry.term_offset(position) + len(data) <= geometry.term_length

    check()


def test_a_reusing_framer_holds_a_buffer_as_long_as_its_blocks() -> None:
    """A framer that reuses its block buffer (the sink committer's, a session's publisher's)
    made it max_block_bytes (4 MiB) long at its first block of equal-length messages, however
    short: fifty 100-byte rows allocated 4 MiB. Now the buffer is as long as the blocks asked
    for (twice as long, up to max_block_bytes, when a longer one comes); the bytes framed are
    the copying framer's."""
    import tracemalloc

    import numpy as np

    geometry = LogGeometry(term_length=64 * 1024 * 1024, mtu=1408, initial_term_id=3)
    reusing = Framer(geometry, 1, 2, 0, reuse_blocks=True)
    copying = Framer(geometry, 1, 2, 0)
    small = np.frombuffer(b"s" * 5000, dtype=np.uint8).reshape(50, 100)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        got = [(p, bytes(b)) for p, b in reusing.frame(small)]
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"framing 50 x 100 bytes peaked at {peak / 2**20:.2f} MiB"
    assert got == [(p, bytes(b)) for p, b in copying.frame(small)]
    for rows, length in ((3000, 1000), (20, 100), (9000, 500)):  # longer, shorter, longer
        run = np.frombuffer(bytes(range(256)) * (rows * length // 256 + 1), dtype=np.uint8)
        run = run[: rows * length].reshape(rows, length)
        assert [(p, bytes(b)) for p, b in reusing.frame(run)] == [
            (p, bytes(b)) for p, b in copying.frame(run)
        ]

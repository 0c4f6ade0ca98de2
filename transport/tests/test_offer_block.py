"""``offer_block``: Aeron's ``ExclusivePublication.offerBlock`` (a block of whole, already framed
fragments copied into the current term, ids rewritten, the first frame's length written last)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import (
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    Driver,
    DriverConfig,
    FragmentAssembler,
)
from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.frames import DATA_HEADER, DataFlags, FrameType, StatusMessage
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.term import (
    FragmentAssembler as TermAssembler,
)
from aeron_spark.transport.protocol.term import (
    Header,
    TermAppender,
    encode_data_header,
    read_term,
)

TERM = 64 * 1024
MTU = 1408
TIMEOUT_S = 20.0
FILLER = -5


def framed(
    messages: list[tuple[bytes, int]], *, term_offset: int = 96, term_id: int = 1000
) -> bytes:
    """``messages`` framed by another log (foreign session, stream, term id and offsets)."""
    terms = [memoryview(bytearray(TERM)) for _ in range(3)]
    appender = TermAppender(LogGeometry(TERM, MTU, 990), terms, 4242, 4343, term_id, term_offset)
    for payload, rv in messages:
        appender.append(payload, rv)
    return bytes(terms[appender.partition][term_offset : appender.term_offset])


def make(term_offset: int = 0, connected: bool = True) -> PublicationState:
    pub = PublicationState(
        session_id=77,
        stream_id=10,
        initial_term_id=5,
        term_id=5,
        term_offset=term_offset,
        term_length=TERM,
        mtu=MTU,
        destination=("127.0.0.1", 40123),
    )
    if connected:
        position = pub.start_position
        sm = StatusMessage(77, 10, 5 + (position >> pub.shift), position & (TERM - 1), TERM, 9)
        pub.on_status_message(sm, ("127.0.0.1", 50000), 0)
    return pub


def read_all(pub: PublicationState, partition: int, start: int) -> list[tuple[bytes, int, Any]]:
    """(message, reserved value, header fields of its first frame) read from ``start``."""
    got: list[tuple[bytes, int, Any]] = []

    def on_message(payload: memoryview, header: Header) -> None:
        got.append((bytes(payload), header.reserved_value, None))

    frames: list[tuple] = []

    def on_fragment(payload: memoryview, header: Header) -> None:
        frames.append(DATA_HEADER.unpack_from(header.buffer, header.offset))
        assembler(payload, header)

    assembler = TermAssembler(on_message)
    read_term(pub.terms[partition], start, on_fragment, 1 << 30, Header(5, pub.shift))
    return [(m, rv, frames) for m, rv, _ in got]


MESSAGES = [(b"a" * 10, 0), (b"b" * 3000, 7), (b"c" * 100, -1), (b"d" * (MTU - 32), 2**40)]


def test_a_block_lands_whole_with_this_publications_ids_and_offsets() -> None:
    pub = make()
    pub.offer(b"first", 0)
    start = pub.position
    block = framed(MESSAGES)
    assert pub.offer_block(block) == start + len(block)
    assert pub.position == start + len(block)
    got = read_all(pub, 0, 0)
    assert [(m, rv) for m, rv, _ in got] == [(b"first", 0), *MESSAGES]
    frames = got[0][2]
    offset = 0
    for length, _v, _flags, ftype, term_offset, session, stream, term_id, _rv in frames:
        assert (ftype, term_offset, session, stream, term_id) == (FrameType.DATA, offset, 77, 10, 5)
        offset += (length + 31) & -32
    assert offset == start + len(block)
    pub.offer(b"after", 0)  # an ordinary offer carries on right behind the block
    assert read_all(pub, 0, start + len(block))[0][:2] == (b"after", 0)


def test_a_block_of_equal_length_frames_gets_every_frames_ids_and_offset() -> None:
    """Fixed-size rows (the archive sink's common case) take the numpy path: every frame's
    term offset, session, stream and term id are this log's, reserved values and payloads as
    they were, and an ordinary offer carries on behind the block."""
    pub = make()
    pub.offer(b"first", 0)
    start = pub.position
    rows = [(bytes([i]) * 100, i * 1000 - 7) for i in range(40)]
    block = framed(rows, term_offset=640, term_id=1234)
    assert pub.offer_block(block) == start + len(block)
    pub.offer(b"after", 0)
    got = read_all(pub, 0, 0)
    assert [(m, rv) for m, rv, _ in got] == [(b"first", 0), *rows, (b"after", 0)]
    offset = 0
    for length, _v, flags, ftype, term_offset, session, stream, term_id, _rv in got[0][2]:
        assert (ftype, flags, term_offset, session, stream, term_id) == (
            FrameType.DATA,
            DataFlags.UNFRAGMENTED,
            offset,
            77,
            10,
            5,
        )
        offset += (length + 31) & -32
    assert offset == pub.position


def test_a_block_spanning_the_term_end_is_refused_and_split_blocks_fill_then_rotate() -> None:
    pub = make(term_offset=TERM - 4096)
    block = framed([(bytes([i]) * 1000, i) for i in range(5)])  # 5 x 1056 > 4096
    before = bytes(pub.terms[0])
    with pytest.raises(LocalProtocolError, match="cannot span a term end"):
        pub.offer_block(block)
    assert bytes(pub.terms[0]) == before and pub.position == pub.start_position
    # split at a frame boundary: three frames fit, then pad the rest of the term in the block
    head = block[: 3 * 1056]
    pad = encode_data_header(4096 - len(head), DataFlags.UNFRAGMENTED, FrameType.PAD, 0, 0, 0, 0)
    pad_frame = pad + bytes(4096 - len(head) - 32)
    assert pub.offer_block(head + pad_frame) == pub.start_position + 4096
    assert pub.appender.term_offset == TERM
    # the next block goes to offset 0 of the next term (the full term is rotated first)
    position = pub.offer_block(block[3 * 1056 :])
    assert position == pub.start_position + 4096 + 2 * 1056
    assert (pub.appender.term_id, pub.appender.term_offset) == (6, 2 * 1056)
    got = read_all(pub, 1, 0)
    assert [(m, rv) for m, rv, _ in got] == [(bytes([i]) * 1000, i) for i in (3, 4)]
    assert {f[7] for f in got[0][2]} == {6}
    assert [(m, rv) for m, rv, _ in read_all(pub, 0, TERM - 4096)] == [
        (bytes([i]) * 1000, i) for i in range(3)
    ]


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda b: b[:-16], "multiple of 32"),
        (lambda b: b"", "multiple of 32"),
        (lambda b: b[:6] + bytes([FrameType.PAD, 0]) + b[8:], "bad frame at byte 0"),
        # the last frame's length runs past the block: found after the rest was copied
        (lambda b: b[:-160] + (1000).to_bytes(4, "little") + b[-156:], "bad frame at byte"),
        (lambda b: b[:-160] + (8).to_bytes(4, "little") + b[-156:], "bad frame at byte"),
    ],
)
def test_a_malformed_block_is_refused_and_readers_see_nothing_of_it(mutate: Any, why: str) -> None:
    pub = make()
    pub.offer(b"kept", 0)
    position = pub.position
    block = mutate(framed([(b"x" * 100, 0)] * 5))
    with pytest.raises(LocalProtocolError, match=why):
        pub.offer_block(block)
    assert pub.position == position
    assert bytes(pub.terms[0][position:]) == bytes(TERM - position)  # no frame, no header left
    assert [m for m, _, _ in read_all(pub, 0, 0)] == [b"kept"]


def test_back_pressure_not_connected_closed_and_max_position() -> None:
    block = framed([(b"y" * 200, 0)] * 4)
    pub = make(connected=False)
    assert pub.offer_block(block) == NOT_CONNECTED
    pub = make()
    while (result := pub.offer_block(block)) > 0:  # up to the window (term_length / 2)
        pass
    assert result == BACK_PRESSURED and pub.back_pressure_events == 1
    assert pub.position >= pub.publisher_limit
    pub = make()
    pub.max_position = len(block) - 32
    assert pub.offer_block(block) == MAX_POSITION_EXCEEDED
    pub.close(0)
    assert pub.offer_block(block) == CLOSED


def _collect(sub: Any, want: int, got: list[tuple[bytes, int]]) -> None:
    def on_message(payload: memoryview, header: Any) -> None:
        if header.reserved_value != FILLER:  # the empty message of a term filler
            got.append((bytes(payload), header.reserved_value))

    assembler = FragmentAssembler(on_message)
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < want and time.monotonic() < deadline:
        if sub.poll(assembler, 64) == 0:
            sub.wait(0.05)


def filler(room: int) -> bytes:
    """An empty message (reserved value FILLER) and a PAD frame: ``room`` bytes."""
    empty = framed([(b"", FILLER)])
    if room == len(empty):
        return empty
    pad = encode_data_header(room - 32, DataFlags.UNFRAGMENTED, FrameType.PAD, 0, 0, 0, 0)
    return empty + pad + bytes(room - 64)


def _blocks(messages: list[tuple[bytes, int]], per_block: int) -> list[bytes]:
    return [framed(messages[i : i + per_block]) for i in range(0, len(messages), per_block)]


def test_blocks_through_a_real_udp_driver_under_back_pressure(tmp_path: Path) -> None:
    messages = [(i.to_bytes(4, "little") * 60, i) for i in range(3000)]  # 240 B: 288 framed
    with Driver(DriverConfig(directory=tmp_path)) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0|rcv-wnd=8k", 4)
        port = sub.local_endpoints[0][1]
        pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k", 4)
        assert pub.wait_until_connected(TIMEOUT_S)
        got: list[tuple[bytes, int]] = []
        consumer = threading.Thread(target=_collect, args=(sub, len(messages), got))
        consumer.start()
        room = TERM
        for block in _blocks(messages, 10):  # 2880 bytes: split where a term ends
            if len(block) > room:  # fill the term: an empty message, then a PAD frame
                pub.offer_block_blocking(filler(room), timeout_s=TIMEOUT_S)
                assert pub.position & (TERM - 1) == 0
            pub.offer_block_blocking(block, timeout_s=TIMEOUT_S)
            room = TERM - (pub.position & (TERM - 1))
        consumer.join(TIMEOUT_S)
        assert got == messages


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A folder for IPC drivers' directories (in /dev/shm where there is one), removed after."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    folder = Path(tempfile.mkdtemp(prefix=f"aeron-spark-offer-block-{os.getpid()}-", dir=base))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_blocks_over_ipc(tmp_path: Path, shm: Path) -> None:
    directory = shm / f"aeron-spark-offer-block-{os.getpid()}-{time.monotonic_ns()}"
    messages = [(bytes([i % 256]) * (i % 2000 + 1), i) for i in range(400)]
    with Driver(DriverConfig(directory=directory, write_counters_file=False)) as d:
        pub = d.add_publication("aeron:ipc?term-length=1m", 21)
        sub = d.add_subscription("aeron:ipc", 21)
        assert pub.wait_until_connected(TIMEOUT_S)
        got: list[tuple[bytes, int]] = []
        consumer = threading.Thread(target=_collect, args=(sub, len(messages), got))
        consumer.start()
        for block in _blocks(messages, 20):
            pub.offer_block_blocking(block, timeout_s=TIMEOUT_S)
        consumer.join(TIMEOUT_S)
        pub.close()
        sub.close()
    assert got == messages


def test_ipc_blocks_back_pressure_until_the_subscriber_reads(tmp_path: Path, shm: Path) -> None:
    directory = shm / f"aeron-spark-offer-block-bp-{os.getpid()}-{time.monotonic_ns()}"
    block = framed([(b"z" * 1000, 1)] * 8)  # 8 KiB
    with Driver(DriverConfig(directory=directory, write_counters_file=False)) as d:
        pub = d.add_publication("aeron:ipc?term-length=64k", 22)
        sub = d.add_subscription("aeron:ipc", 22)
        assert pub.wait_until_connected(TIMEOUT_S)
        sent = 0
        while (result := pub.offer_block(block)) > 0:
            sent += 1
            assert sent < 64, "never back pressured"
        assert result == BACK_PRESSURED
        got: list[tuple[bytes, int]] = []
        _collect(sub, sent * 8, got)
        assert got == [(b"z" * 1000, 1)] * (sent * 8)
        assert pub.offer_block_blocking(block, timeout_s=TIMEOUT_S) > 0
        pub.close()
        sub.close()

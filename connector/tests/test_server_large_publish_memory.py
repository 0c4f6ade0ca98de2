"""What the server holds for a large publish (issue 31 item 5): the message it reassembled, not
a decoded copy of its payload nor a block it was framed into.

Before, a reassembled 16 MiB publish was copied out of the reassembled buffer by msgpack (which
has no zero-copy ``bin``), then copied again into the one block written to the recording: the
server held the message about three times (twice at once). Now a large ``publish``/``stage`` is
decoded with its payloads as views into the reassembled buffer (``_decode_payload_args``) and a
large payload is written beside its frame headers with ``os.pwritev`` (a ``Gathered`` block),
still in one append. Measured as counts: traced allocations (``tracemalloc``: bytes objects,
bytearrays and numpy buffers are all traced) and the parts of a framed block that are the
payload's own memory; and the recorded bytes are the same as the old framing's.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import ServerCore
from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto
from aeron_spark.transport.archive.diskio import IOV_MAX, Gathered
from aeron_spark.transport.archive.recordings import RecordingStore
from aeron_spark.transport.protocol.logbuffer import LogGeometry

MIB = 1024 * 1024
WALL_NS = 1_700_000_000_000_000_000


@pytest.fixture
def core(tmp_path):
    # 128 MiB terms: 16 MiB is the largest message (Aeron's cap)
    config = ServerConfig(directory=str(tmp_path), port=0, term_length=128 * MIB)
    store = ArchiveStore(config, driver=None)
    core = ServerCore(config, store, SinkCommitter(os.path.join(str(tmp_path), "sink"), store))
    yield core
    store.close()


def _chunks(request_id: int, args: dict, chunk_bytes: int) -> Iterator[bytearray]:
    """The chunk messages a client sends for a request (cut as they go, as the client does)."""
    parts = proto.encode_request_parts(request_id, "publish", args)
    return chunking.split_parts(parts, chunk_bytes, payload_id=request_id)


def _recorded(core, recording_id: int, end: int) -> bytes:
    cursor = core.store.open_replay(recording_id, 0, end)
    out = bytearray()
    while (read := cursor.read(4 * MIB, 0)) is not None:
        out += read[3]
    cursor.close()
    return bytes(out)


def test_a_16_mib_publish_is_reassembled_decoded_and_recorded_holding_it_once(core) -> None:
    """The whole server path of a chunked 16 MiB publish (reassembly, decoding, framing, the
    append) allocates the reassembled message and little else: traced peak <= 1.25x the
    message. On the old code the decoded payload and the framed block came beside it (peak
    ~2x: the reassembled buffer and the decoded payload, then the payload and its block)."""
    size = 16 * MIB
    payload = os.urandom(size)
    core.open_session("a", "peer-a", MIB, now_ns=0)
    chunks = _chunks(7, {"stream_id": 5, "payloads": [b"small", payload]}, MIB)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        replies: list[bytes] = []
        for chunk in chunks:
            replies += core.on_message("a", chunk, 1, WALL_NS)
            del chunk
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    (reply,) = replies
    decoded = proto.decode_reply(reply)
    assert decoded.ok, decoded.error
    assert peak <= 1.25 * size, f"{peak / size:.2f}x the message"
    # what was recorded is what the old framing made of the same payloads, byte for byte
    (recording,) = core.store.list_recordings({5})
    end = decoded.result
    geometry = LogGeometry(128 * MIB, recording["mtu"], recording["initial_term_id"])
    framer = Framer(geometry, recording["session_id"], 5, 0)
    expected = b"".join(bytes(block) for _, block in framer.frame([b"small", payload]))
    assert end == len(expected)
    assert _recorded(core, recording["recording_id"], end) == expected
    assert core.counters["bytes_published"] == size + 5


def test_a_large_payload_is_framed_as_headers_beside_its_own_memory() -> None:
    """Counted: of a framed block holding a 3 MiB payload, only its fragments' headers, the
    last one's alignment and the small frames around it are new bytes; every payload byte is
    a view of the payload itself. The bytes are those of the copying framer, at any position
    in a term (a PAD before it when it does not fit)."""
    geometry = LogGeometry(64 * MIB, 65504, 7)
    big = os.urandom(3 * MIB + 5)
    payloads = [b"a" * 10, big, b"c" * 100]
    for start in (0, 64 * MIB - 200_000):
        gathered = list(Framer(geometry, 1, 2, start).frame_gathered(payloads))
        copied = list(Framer(geometry, 1, 2, start).frame(payloads))
        assert [p for p, _ in gathered] == [p for p, _ in copied]
        assert [b.tobytes() if isinstance(b, Gathered) else bytes(b) for _, b in gathered] == [
            bytes(b) for _, b in copied
        ]
        (block,) = [b for _, b in gathered if isinstance(b, Gathered)]
        own = sum(len(p) for p in block.parts if isinstance(p, memoryview) and p.obj is big)
        assert own == len(big)
        fragments = -(-len(big) // geometry.max_payload_length)
        # new bytes: a header per fragment, the last one's alignment, the small frames
        assert len(block) - own <= fragments * 32 + 32 + 2 * 160


def test_a_gathered_append_is_one_append_all_or_nothing(tmp_path, monkeypatch) -> None:
    """A gathered block is written with os.pwritev: short writes are continued, and a write
    that fails half-way leaves nothing of the message (the recorded end and the files as they
    were), so a recording's index never points inside a message."""
    config = ServerConfig(directory=str(tmp_path), port=0)
    store = ArchiveStore(config, driver=None)
    try:
        publisher = store.open_publisher(5, "test", 0)
        real = os.pwritev
        calls = {"n": 0}

        def short(fd: int, buffers: list, offset: int) -> int:  # writes at most 100,000 bytes
            calls["n"] += 1
            view = b"".join(bytes(b) for b in buffers)[:100_000]
            return real(fd, [view], offset)

        monkeypatch.setattr(os, "pwritev", short)
        big = os.urandom(MIB + 3)
        end = publisher.publish([b"x", big], None, 0)
        assert calls["n"] > 10 and publisher.rec.short_writes > 0
        monkeypatch.setattr(os, "pwritev", real)
        assert _recorded_of(store, publisher, end) == b"".join(
            bytes(b)
            for _, b in Framer(publisher._framer.geometry, publisher.rec.d.session_id, 5, 0).frame(
                [b"x", big]
            )
        )

        def full_half_way(fd: int, buffers: list, offset: int) -> int:
            if calls["n"] > 0:
                calls["n"] = 0
                return real(fd, [b"".join(bytes(b) for b in buffers)[:70_000]], offset)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "pwritev", full_half_way)
        calls["n"] = 1
        with pytest.raises(OSError):
            publisher.publish([big], None, 0)
        monkeypatch.setattr(os, "pwritev", real)
        assert publisher.rec.recorded_position == end
        segment = os.path.join(publisher.rec.directory, f"{0:020d}.seg")
        assert os.path.getsize(segment) == end
        assert publisher.publish([b"after"], None, 0) > end  # the next goes where it stopped
    finally:
        store.close()


def _recorded_of(store, publisher, end: int) -> bytes:
    cursor = store.open_replay(publisher.recording_id, 0, end)
    out = bytearray()
    while (read := cursor.read(4 * MIB, 0)) is not None:
        out += read[3]
    cursor.close()
    return bytes(out)


# --- the view decoder accepts and refuses what msgpack's decoding does -------------------------


def _decode_both(message: bytes) -> tuple[object, object]:
    """``decode_request`` of ``message`` with payloads decoded as views and with msgpack (the
    threshold set for the call, then restored): the Request (byte strings as bytes) or the
    error's type."""
    out = []
    saved = proto.VIEW_DECODE_BYTES
    for threshold in (0, 1 << 62):
        proto.VIEW_DECODE_BYTES = threshold
        try:
            request = proto.decode_request(message)
        except ControlProtocolError as exc:
            out.append(type(exc))
            continue
        finally:
            proto.VIEW_DECODE_BYTES = saved
        args = {
            k: [bytes(p) if isinstance(p, memoryview) else p for p in v]
            if isinstance(v, list)
            else v
            for k, v in request.args.items()
        }
        if threshold == 0 and "payloads" in request.args:  # views, not copies
            assert all(isinstance(p, memoryview) for p in request.args["payloads"])
        out.append((request.id, request.op, args))
    return out[0], out[1]


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=300),
    st.text(max_size=40),
)
_values = st.one_of(
    _scalars,
    st.lists(_scalars, max_size=5),
    st.lists(st.binary(max_size=1000), max_size=3),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=5),
    st.dictionaries(st.text(max_size=5), _scalars, max_size=2),
    st.lists(st.lists(st.integers(min_value=-(2**63), max_value=2**63), max_size=2), max_size=2),
)
_keys = st.sampled_from(
    ["stream_id", "payloads", "reserved_values", "sink_id", "batch_id", "partition_id"]
    + ["attempt", "final", "other", ""]
)


_publishes = st.fixed_dictionaries(
    {
        "stream_id": st.integers(min_value=-(2**31), max_value=2**31 - 1),
        "payloads": st.lists(st.binary(max_size=1000), max_size=4),
    },
    optional={"reserved_values": st.none() | st.lists(st.integers(-(2**63), 2**63 - 1))},
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(["publish", "stage"]),
    args=st.dictionaries(_keys, _values, max_size=7) | _publishes,
    cut=st.integers(min_value=0, max_value=40),
    tail=st.binary(max_size=3),
)
def test_views_and_msgpack_decode_the_same_requests(op, args, cut, tail) -> None:
    """Arbitrary argument maps and valid publishes, truncated or with bytes after them:
    both decoders accept the same requests with the same values, and refuse the same ones."""
    message = proto.encode_request(3, op, args)
    for variant in (message, message[: len(message) - cut], message + tail):
        views, copies = _decode_both(variant)
        assert views == copies


@pytest.mark.parametrize(
    "args",
    [
        {"stream_id": 5, "payloads": [b"a" * 300_000, b"", b"b"], "reserved_values": [1, -1, 2]},
        {"stream_id": -(2**31), "payloads": [], "reserved_values": None},
        {"stream_id": 2**31, "payloads": [b"x"]},  # out of range
        {"stream_id": 5, "payloads": [b"x"], "reserved_values": [2**63]},  # out of range
        {"stream_id": 5, "payloads": ["text"]},  # a string is not a byte string
        {"stream_id": 5, "payloads": [b"x"], "stream_id2": 1},  # unknown argument
        {"payloads": [b"x"]},  # missing argument
        {"stream_id": 5, "payloads": [b"x"] * (proto.MAX_PAYLOADS_PER_REQUEST + 1)},
    ],
)
def test_views_and_msgpack_agree_on_publish_at_the_edges(args) -> None:
    views, copies = _decode_both(proto.encode_request(9, "publish", args))
    assert views == copies


def test_views_and_msgpack_agree_on_hand_made_encodings() -> None:
    """Encodings msgpack's packer never makes but its decoder takes (wide forms of small
    values, a key twice), and ones both refuse (a bin key, a map value, bad UTF-8, a bin
    longer than its operation allows, more items than it allows)."""
    head = bytes((proto.KIND_CONTROL, 0x83)) + b"".join(
        msgpack.packb(x) for x in ("id", 1, "op", "publish", "args")
    )
    payloads = b"\xa8payloads\x92\xc6\x00\x00\x00\x03abc\xc4\x00"
    bodies = [
        b"\x82\xa9stream_id\xd3" + (5).to_bytes(8, "big", signed=True) + payloads,
        b"\x82\xa9stream_id\xcc\x05" + payloads,
        b"\x83\xa9stream_id\x01\xa9stream_id\x02" + payloads,  # the last value wins
        b"\xde\x00\x02\xa9stream_id\x05" + b"\xa8payloads\xdc\x00\x01\xc5\x00\x01z",
        b"\xdf\x00\x00\x00\x02\xd9\x09stream_id\x05" + payloads,
        b"\x82\xc4\x09stream_id\x05" + payloads,  # a bin key
        b"\x82\xa9stream_id\x81\xa1a\x01" + payloads,  # a map value
        b"\x82\xa9stream_id\xca\x00\x00\x00\x00" + payloads,  # a float
        b"\x82\xa9stream_id\x05\xa8payloads\x91\xa2\xff\xfe",  # bad UTF-8
        b"\x82\xa9stream_id\x05\xa8payloads\x91\xc6\x01\x00\x00\x01",  # bin past 16 MiB
        b"\x82\xa9stream_id\x05\xa8payloads\xdd\x00\x01\x00\x01",  # array past its limit
        b"\x82\xa9stream_id\x05\xa8payloads\x91\xd4\x01\x00",  # ext
        b"\x05",  # not a map
    ]
    for body in bodies:
        views, copies = _decode_both(head + body)
        assert views == copies, body
    assert _decode_both(head + bodies[2])[0][2]["stream_id"] == 2


def test_a_gathered_block_crosses_a_segment_end_in_iov_max_batches(tmp_path, monkeypatch) -> None:
    """Counted: 3,000 parts of 3 bytes from 1,000 bytes before a segment file's end are
    written in pwritev calls of at most IOV_MAX buffers, one ending at the segment's end (the
    part across it cut there), and the bytes land on both sides of it as one block's would."""
    store = RecordingStore(str(tmp_path), fsync=False)
    try:
        segment = 64 * MIB
        # starts 1,000 bytes before the first segment file's end (terms of 64 MiB)
        rec = store.create(5, 1, "test", 0, 0, segment - 1000, 64 * MIB, 1408, 0)
        assert rec.d.segment_length == segment
        parts = [bytes([i % 251]) * 3 for i in range(3000)]
        real = os.pwritev
        calls: list[int] = []

        def counting(fd: int, buffers: list, offset: int) -> int:
            calls.append(len(buffers))
            return real(fd, buffers, offset)

        monkeypatch.setattr(os, "pwritev", counting)
        rec.append(Gathered(parts, 9000), segment - 1000, 0)
        monkeypatch.setattr(os, "pwritev", real)
        assert IOV_MAX == 1024 and calls == [334, 1024, 1024, 619]  # 333 parts + a third
        assert rec.recorded_position == segment + 8000
        with open(os.path.join(rec.directory, f"{0:020d}.seg"), "rb") as fh:
            fh.seek(segment - 1000)
            first = fh.read()
        with open(os.path.join(rec.directory, f"{segment:020d}.seg"), "rb") as fh:
            second = fh.read()
        assert first + second == b"".join(parts)
    finally:
        store.close(0)


def test_a_large_stage_is_staged_from_views_of_the_request(core) -> None:
    """A stage request of 1 MiB or more (its payloads views into the reassembled request) is
    staged as the same records a small one is: read back, the payloads and reserved values
    are those sent."""
    payloads = [os.urandom(3 * MIB), b"tail", os.urandom(70_000)]
    args = {
        "sink_id": "big",
        "batch_id": 0,
        "partition_id": 0,
        "attempt": 0,
        "stream_id": 5,
        "payloads": payloads,
        "reserved_values": [7, -1, 2**40],
        "final": True,
    }
    core.open_session("a", "peer-a", MIB, now_ns=0)
    parts = proto.encode_request_parts(3, "stage", args)
    replies: list[bytes] = []
    for chunk in chunking.split_parts(parts, MIB, payload_id=3):
        replies += core.on_message("a", chunk, 1, WALL_NS)
    (reply,) = replies
    staged = proto.decode_reply(reply)
    assert staged.ok, staged.error
    assert (staged.result["count"], staged.result["bytes"]) == (3, sum(map(len, payloads)))
    path = core.committer.staging.check_part(staged.result)
    got, rvs = [], []
    for batch, values in core.committer.staging.read_part(path):
        got += [bytes(p) for p in batch]
        rvs += list(values)
    assert got == payloads and rvs == [7, -1, 2**40]


def test_many_small_payloads_are_decoded_by_msgpack() -> None:
    """A large request of more than VIEW_DECODE_MAX_ITEMS payloads is decoded by msgpack (a
    Python loop per item cost ~9x its time), copies; at the bound, views."""
    for count, kind in ((proto.VIEW_DECODE_MAX_ITEMS, memoryview), (257, bytes)):
        size = proto.VIEW_DECODE_BYTES // count + 1
        message = proto.encode_request(
            1, "publish", {"stream_id": 5, "payloads": [b"x" * size] * count}
        )
        assert len(message) >= proto.VIEW_DECODE_BYTES
        payloads = proto.decode_request(message).args["payloads"]
        assert len(payloads) == count and all(type(p) is kind for p in payloads)
        assert all(bytes(p) == b"x" * size for p in payloads)

"""Control protocol codecs: strict request decoding, typed error round trips, chunking."""

from __future__ import annotations

import os
import pickle

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.connector import errors as E
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import ServerCore
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto


def test_request_round_trip() -> None:
    msg = proto.encode_request(7, "replay", {"recording_id": 3, "start": 0, "end": 4096})
    req = proto.decode_request(msg)
    assert (req.id, req.op, req.args) == (7, "replay", {"recording_id": 3, "start": 0, "end": 4096})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"id": 1, "op": "nope", "args": {}}, "unknown operation"),
        ({"id": 1, "op": "replay", "args": {"recording_id": 1}}, "missing argument start"),
        ({"id": 1, "op": "replay", "args": {"recording_id": 1, "start": -32}}, "start"),
        (
            {"id": 1, "op": "replay", "args": {"recording_id": 1, "start": 0, "x": 1}},
            "unknown arguments",
        ),
        (
            {"id": 1, "op": "publish", "args": {"stream_id": 1, "payloads": ["text"]}},
            "byte strings",
        ),
        ({"id": 1, "op": "stats", "args": {}, "extra": 1}, "exactly the keys"),
        ({"id": -1, "op": "stats", "args": {}}, "unsigned 32-bit"),
        (
            {
                "id": 1,
                "op": "commit",
                "args": {
                    "sink_id": "s",
                    "batch_id": 0,
                    "stream_id": 1,
                    "staged": [{"part": "0-0"}],
                },
            },
            "staged-part map",
        ),
        (
            {
                "id": 1,
                "op": "stage",
                "args": {
                    "sink_id": "",
                    "batch_id": 0,
                    "partition_id": 0,
                    "attempt": 0,
                    "stream_id": 1,
                    "payloads": [],
                    "final": True,
                },
            },
            "sink_id",
        ),
    ],
)
def test_invalid_requests_are_protocol_errors(body: dict, fragment: str) -> None:
    msg = b"\x01" + msgpack.packb(body, use_bin_type=True)
    with pytest.raises(E.ControlProtocolError, match=fragment) as info:
        proto.decode_request(msg)
    if isinstance(body.get("id"), int) and body["id"] >= 0:
        assert info.value.details["request_id"] == body["id"]


@pytest.fixture
def core(tmp_path):
    config = ServerConfig(directory=str(tmp_path), port=0, session_lease_ns=10**12)
    store = ArchiveStore(config, driver=None)
    core = ServerCore(config, store, SinkCommitter(os.path.join(str(tmp_path), "sink"), store))
    core.open_session("peer", "peer", 64 * 1024, now_ns=0)
    yield core
    store.close()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200))
def test_garbage_is_refused_counted_and_the_session_still_works(core, data: bytes) -> None:
    """Garbage as a control message: the codec raises only ControlProtocolError; the server
    answers it with exactly one CONTROL_PROTOCOL error, counts it, and the same session's next
    request is served."""
    for message in (data, b"\x01" + data):
        if message[:1] == bytes([proto.KIND_CHUNK]):
            continue  # a chunk header: the reassembler's business, fuzzed in test_server_core
        try:
            proto.decode_request(message)
        except E.ControlProtocolError:
            refused = True
        else:
            refused = False  # hypothesis built a valid request: not garbage
        before = dict(core.counters)
        session_errors = core.sessions["peer"].errors
        replies = core.on_message("peer", message, 1, 1)
        if refused:
            (reply,) = (proto.decode_reply(r) for r in replies)
            assert not reply.ok and reply.error["code"] == int(E.ErrorCode.CONTROL_PROTOCOL)
            assert isinstance(E.error_from_wire(reply.error), E.ControlProtocolError)
            assert core.counters["protocol_errors"] == before["protocol_errors"] + 1
            assert core.sessions["peer"].errors == session_errors + 1
        (answer,) = core.on_message("peer", proto.encode_request(9, "stats", {}), 2, 2)
        ok = proto.decode_reply(answer)
        assert ok.ok and ok.id == 9
    assert core.counters["internal_errors"] == 0


@pytest.mark.parametrize(
    "cls",
    [
        E.ServerUnavailableError,
        E.UnknownStreamError,
        E.UnknownRecordingError,
        E.PositionOutOfRangeError,
        E.NotFrameBoundaryError,
        E.PurgedError,
        E.NotAuthorisedError,
        E.ControlProtocolError,
        E.ChunkMissingError,
        E.PayloadTooLargeError,
        E.LimitExceededError,
        E.StagedDataMissingError,
        E.StorageFullError,
        E.TooManyOpenFilesError,
        E.ServerError,
    ],
)
def test_errors_cross_the_wire_with_their_class_and_details(cls: type[E.ConnectorError]) -> None:
    exc = cls("boom", position=64, before=32, after=96)
    reply = proto.decode_reply(proto.encode_error(5, exc))
    assert (reply.id, reply.ok) == (5, False)
    back = E.error_from_wire(reply.error)
    assert type(back) is cls and str(back) == "boom"
    assert (back.position, back.before, back.after) == (64, 32, 96)
    again = pickle.loads(pickle.dumps(back))
    assert type(again) is cls and again.details == back.details
    assert isinstance(back, E.ConnectorError)


def test_malformed_error_reply_is_a_protocol_error() -> None:
    assert isinstance(E.error_from_wire({"code": "x"}), E.ControlProtocolError)
    assert isinstance(E.error_from_wire(None), E.ControlProtocolError)


def test_replay_data_header_round_trip() -> None:
    msg = proto.encode_replay_header(9, 1024, 2048, 123) + b"\x00" * 64
    rid, pos, end, ts, frames = proto.decode_replay_data(msg)
    assert (rid, pos, end, ts, len(frames)) == (9, 1024, 2048, 123, 64)
    with pytest.raises(E.ControlProtocolError):
        proto.decode_replay_data(msg[:10])


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=5000), st.integers(min_value=40, max_value=700))
def test_chunks_reassemble(payload: bytes, limit: int) -> None:
    r = chunking.Reassembler()
    chunks = list(chunking.split(payload, limit, 42))
    assert all(len(c) <= limit for c in chunks)
    results = [r.feed(c, 0) for c in chunks]
    assert results[:-1] == [None] * (len(chunks) - 1)
    assert results[-1] == payload
    assert r.open_payload_id is None


def test_missing_chunk_is_a_clear_error_and_next_payload_still_works() -> None:
    r = chunking.Reassembler()
    chunks = list(chunking.split(b"x" * 1000, 128, 1))
    r.feed(chunks[0], 0)
    with pytest.raises(E.ChunkMissingError, match="expected chunk 1 of payload 1, got chunk 2"):
        r.feed(chunks[2], 0)
    assert r.discarded == 1
    assert [r.feed(c, 0) for c in chunking.split(b"y" * 300, 128, 2)][-1] == b"y" * 300
    with pytest.raises(E.ChunkMissingError, match="without its first chunk"):
        r.feed(chunks[3], 0)


def test_open_payload_expires() -> None:
    r = chunking.Reassembler(timeout_ns=1000)
    r.feed(next(iter(chunking.split(b"z" * 500, 100, 3))), 0)
    with pytest.raises(E.ChunkMissingError, match="did not arrive"):
        r.check_expired(5000)
    assert r.open_payload_id is None


def test_oversized_chunked_payload_refused() -> None:
    r = chunking.Reassembler(max_payload_bytes=100)
    with pytest.raises(E.PayloadTooLargeError):
        r.feed(next(iter(chunking.split(b"z" * 500, 100, 3))), 0)


def test_reassembly_charges_bytes_as_they_arrive_within_a_shared_budget() -> None:
    """Issue 28, item 2 (sans I/O): a header announcing a large payload holds only what came;
    two reassemblers share one budget, a chunk past it is refused (LIMIT_EXCEEDED) and its
    payload discarded, and expiry on the clock gives the bytes back."""
    budget = chunking.ReassemblyBudget(1000)
    a = chunking.Reassembler(max_payload_bytes=10_000, timeout_ns=100, budget=budget)
    b = chunking.Reassembler(max_payload_bytes=10_000, timeout_ns=100, budget=budget)
    header = chunking.CHUNK_HEADER.pack(chunking.KIND_CHUNK, 1, 0, 1000, 10_000)
    assert a.feed(header + b"a" * 10, 0) is None
    assert (a.held_bytes, budget.held, budget.open) == (10, 10, 1)
    chunks = list(chunking.split(b"b" * 2000, 628, 2))  # 600 bytes a chunk
    assert b.feed(chunks[0], 0) is None
    with pytest.raises(E.LimitExceededError, match="incomplete messages already hold"):
        b.feed(chunks[1], 0)
    assert (b.open_payload_id, b.refused, budget.held, budget.open) == (None, 1, 10, 1)
    assert not a.expire(99) and a.expire(100)
    assert (a.expired, budget.held, budget.open) == (1, 0, 0)
    assert [b.feed(c, 200) for c in chunking.split(b"c" * 900, 628, 3)][-1] == b"c" * 900
    assert (budget.held, budget.open) == (0, 0)


def test_requests_at_their_operations_limits_decode_and_past_them_are_refused() -> None:
    """Issue 28, item 4: the largest legitimate request of each list-carrying operation decodes
    within its limits; a control request past 64 KiB is PAYLOAD_TOO_LARGE on its id."""
    n = proto.MAX_PAYLOADS_PER_REQUEST
    staged = {
        "sink_id": "s",
        "batch_id": 1,
        "partition_id": 2,
        "attempt": 0,
        "stream_id": 10,
        "part": "p",
        "count": 1,
        "bytes": 1,
    }
    requests = [
        ("publish", {"stream_id": 1, "payloads": [b"x"] * n, "reserved_values": [-20] * n}),
        (
            "stage",
            {**{k: staged[k] for k in proto.OPS["local_stage"]}, "payloads": [b""] * n}
            | {"reserved_values": [2**40] * n, "final": True},
        ),
        (
            "commit",
            {"sink_id": "s", "batch_id": 1, "stream_id": 10, "staged": [staged] * 50_000},
        ),
        (
            "consumer_commit",
            {
                "consumer_id": "c",
                "stream_ids": list(range(proto.MAX_STREAM_IDS)),
                "positions": [[i, i] for i in range(proto.MAX_POSITIONS)],
            },
        ),
        ("list_recordings", {"stream_ids": list(range(proto.MAX_STREAM_IDS))}),
    ]
    for op, args in requests:
        assert proto.decode_request(proto.encode_request(3, op, args)).args == args
    assert proto.LIMITS["list_streams"].max_bytes == 64 * 1024
    big = proto.encode_request(4, "position_at", {"recording_id": 1, "timestamp_ns": 0})
    with pytest.raises(E.PayloadTooLargeError) as info:
        proto.decode_request(big[:-1] + b"\xc4\xff" + b"\x00" * 70_000)
    assert info.value.details["request_id"] == 4


def test_a_request_nested_too_deep_is_refused_with_a_reason() -> None:
    """msgpack's StackError has no message: a publish whose args nest deeper than the decoder's
    stack came back as ``publish: undecodable args: `` with nothing after the colon."""
    deep = b"\x91" * 5000 + b"\xc0"  # 5,000 nested one-element arrays
    header = msgpack.packb({"id": 7, "op": "publish"})
    message = bytes((proto.KIND_CONTROL,)) + b"\x83" + header[1:] + b"\xa4args" + deep
    with pytest.raises(E.ControlProtocolError) as info:
        proto.decode_request(message)
    text = str(info.value)
    assert text.startswith("publish: undecodable args: ")
    assert text.removeprefix("publish: undecodable args: ").strip(), text
    assert "nested" in text
    assert info.value.details["request_id"] == 7
    with pytest.raises(E.ControlProtocolError, match="nested"):
        proto.decode_reply(bytes((proto.KIND_CONTROL,)) + deep)


_values = st.recursive(
    st.none() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=3) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=2) | st.integers(-9, 9), inner, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_a_msgpack_body_holds_at_most_twice_its_bytes_in_items(value) -> None:
    """The bound by which a small request skips the items budget's hook: what the hook would
    charge for any body of B bytes is at most ``items_bound(B)`` = 2B - 1."""
    body = msgpack.packb(value, use_bin_type=True)
    charged = 0

    def hook(container):
        nonlocal charged
        charged += len(container) + 1
        return container

    msgpack.unpackb(body, raw=False, strict_map_key=False, list_hook=hook, object_hook=hook)
    assert charged <= proto.items_bound(len(body))


def test_the_items_bound_is_reached_and_small_bodies_skip_the_hook(monkeypatch) -> None:
    """B nested arrays charge exactly 2B - 1 items (the bound is tight). A small publish
    (100 bytes) cannot exceed its budget: it is decoded without the hook (3 Python calls a
    publish on the server's loop); a small request of an operation whose budget it can exceed
    is still refused by it."""
    for depth in (1, 2, 50):
        body = b"\x91" * (depth - 1) + b"\x90"
        charged = 0

        def hook(container):
            nonlocal charged
            charged += len(container) + 1
            return container

        msgpack.unpackb(body, list_hook=hook)
        assert charged == proto.items_bound(len(body)) == 2 * depth - 1
    small = proto.encode_request(9, "publish", {"stream_id": 1, "payloads": [b"x" * 100]})
    hostile = proto.encode_request(
        10, "position_at", {"recording_id": {}, "timestamp_ns": {}}
    )  # 5 items where 3 are allowed

    def unused(max_items):
        raise AssertionError(f"the hook was built for a budget of {max_items}")

    with monkeypatch.context() as patched:
        patched.setattr(proto, "_counting_hook", unused)
        assert proto.decode_request(small).args["payloads"] == [b"x" * 100]
    with pytest.raises(E.ControlProtocolError, match="more than 3 items") as info:
        proto.decode_request(hostile)
    assert info.value.details["request_id"] == 10


def test_a_reply_with_a_map_of_thousands_of_entries_is_decoded() -> None:
    """A stats reply of a server with 512 sessions holds ~3,700 transport positions in one map
    (``<kind>:<session>:<stream>``): the client refused it (``3700 exceeds max_map_len(1024)``),
    so ``aeron-spark stat --endpoint`` failed past ~150 sessions. A reply's maps are bounded as
    its lists are (and its memory by the reply's size)."""
    transport = {f"pub:{i}:{i % 8}": i for i in range(20_000)}
    reply = proto.decode_reply(proto.encode_ok(7, {"transport": transport}))
    assert reply.ok and reply.result["transport"] == transport


def test_a_clients_request_head_is_read_without_an_unpacker(monkeypatch) -> None:
    """Issue 31: the stream server's loop made a strict msgpack unpacker for each request's
    head (decode_request was a fifth of a publish's CPU in the core); a head as msgpack
    packs it (the clients') is read in place, every request id width and every operation,
    and only another encoding of it goes to the unpacker."""
    made = []
    real = proto._header_unpacker
    monkeypatch.setattr(proto, "_header_unpacker", lambda m: made.append(1) or real(m))
    for rid in (0, 127, 128, 255, 256, 65535, 65536, proto.MAX_REQUEST_ID):
        for op in proto.OPS:
            request = proto.decode_request(proto.encode_request(rid, op, _minimal_args(op)))
            assert (request.id, request.op) == (rid, op)
    publish = proto.encode_request(9, "publish", {"stream_id": 1, "payloads": [b"p" * 100]})
    assert proto.decode_request(publish).args == {"stream_id": 1, "payloads": [b"p" * 100]}
    assert made == []
    # the same head with its id as a uint64 (msgpack admits it): read by the unpacker, same request
    wide = bytes((proto.KIND_CONTROL,)) + b"\x83\xa2id\xcf" + (9).to_bytes(8, "big") + publish[6:]
    assert proto.decode_request(wide) == proto.decode_request(publish)
    assert made == [1]


def _minimal_args(op: str) -> dict:
    """Arguments ``op``'s schema takes (the required ones, of a valid kind)."""
    values = {
        "int32": 1,
        "pos": 0,
        "uint32": 1,
        "bool": False,
        "str": "s",
        "sink_id": "s",
        "int32_list": [1],
        "int64_list": [1],
        "bytes_list": [b"x"],
        "pos_pairs": [[1, 0]],
        "pos_triples": [[1, 0, 0]],
        "staged_list": [],
    }
    args = {}
    for name, (kind, required) in proto.OPS[op].items():
        if required:
            args[name] = values.get(kind.rstrip("?"), 0)
    return args


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=24), st.integers(0, 40), st.sampled_from(sorted(proto.OPS)))
def test_a_request_decodes_the_same_with_or_without_the_in_place_head(
    noise: bytes, at: int, op: str
) -> None:
    """The in-place head (``_plain_head``) is only a shortcut: any message, a valid request
    with bytes overwritten or cut, decodes to the same request or the same error (and the
    same request id in it) as through the strict unpacker alone."""
    message = bytearray(proto.encode_request(1000, op, _minimal_args(op)))
    message[at : at + len(noise)] = noise
    message = bytes(message)

    def outcome(fast: bool) -> tuple:
        saved = proto._plain_head
        if not fast:
            proto._plain_head = lambda m: None  # type: ignore[assignment]
        try:
            request = proto.decode_request(message)
            return ("ok", request.id, request.op, repr(request.args))
        except E.ConnectorError as exc:
            return ("error", type(exc).__name__, str(exc), exc.details.get("request_id"))
        finally:
            proto._plain_head = saved  # type: ignore[assignment]

    assert outcome(True) == outcome(False)

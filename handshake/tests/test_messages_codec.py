"""Handshake message codecs: round trips, strict decoding, garbage only raises the remote error."""

from __future__ import annotations

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.errors import ErrorCode, RemoteProtocolError
from aeron_spark.handshake.machine import ClientHandshake, ClientState, Rejected, ServerCore

KEY = bytes(range(32))


@pytest.mark.parametrize(
    "message",
    [
        m.Hello(1, 42, KEY, True),
        m.Hello(1, 2**63 - 1, KEY, False),
        m.Welcome(7, KEY, KEY[::-1], b"x" * 64),
        m.Refuse(7, 3, "the server is full"),
        m.Done(b"p" * 16),
        m.Confirm(b"q" * 16),
    ],
)
def test_round_trip(message: m.Message) -> None:
    assert m.decode_message(message.encode()) == message


def test_session_details_round_trip() -> None:
    details = m.SessionDetails(-5, 70000, 123456, 80000, True, 131072, 1 << 20, 65504)
    assert m.SessionDetails.decode(details.encode()) == details


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"t": 1, "v": 1, "ck": 0, "pk": KEY, "enc": True}, "'ck'"),
        ({"t": 1, "v": 1, "ck": 5, "pk": KEY[:31], "enc": True}, "'pk'"),
        ({"t": 1, "v": 1, "ck": 5, "pk": KEY, "enc": 1}, "'enc'"),
        ({"t": 1, "v": 1, "ck": 5, "pk": KEY, "enc": True, "x": 1}, "unexpected keys ['x']"),
        ({"t": 1, "v": 1, "ck": 5, "pk": KEY}, "missing ['enc']"),
        ({"t": 9}, "unknown handshake message type 9"),
        ({"t": "1"}, "integer type"),
        ({"t": 4, "proof": b"short"}, "'proof'"),
        ({"t": 3, "ck": 5, "code": 3, "msg": "x" * 300}, "str"),
    ],
)
def test_strict_decoding_names_the_problem(body: dict, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        m.decode_message(msgpack.packb(body, use_bin_type=True))
    assert fragment in str(info.value)


def test_oversized_and_non_map_messages() -> None:
    with pytest.raises(RemoteProtocolError, match="at most"):
        m.decode_message(b"\x80" + b"x" * m.MAX_HANDSHAKE_MESSAGE_LENGTH)
    with pytest.raises(RemoteProtocolError, match="not a map"):
        m.decode_message(msgpack.packb(5))
    with pytest.raises(RemoteProtocolError):
        m.decode_message(msgpack.packb([1, 2]))  # arrays are refused outright


# Maps with the messages' own keys and plausible values: garbage that gets past the first checks.
near_messages = st.dictionaries(
    st.sampled_from(["t", "v", "ck", "pk", "enc", "cookie", "spk", "epk", "box", "proof"])
    | st.text(max_size=4),
    st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=40) | st.booleans(),
    max_size=7,
).map(lambda d: msgpack.packb(d, use_bin_type=True))


def _valid_message(data: bytes) -> bool:
    try:
        m.decode_message(data)
    except RemoteProtocolError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=1200) | near_messages)
def test_garbage_is_refused_counted_and_both_peers_still_work(data: bytes) -> None:
    """Garbage as a HELLO at the server and as a reply at a waiting client: the codec raises
    only RemoteProtocolError, the server counts it as MALFORMED and allocates nothing, the client
    counts it as ignored and keeps waiting, and then that client completes its handshake."""
    if _valid_message(data):
        return  # hypothesis found a well-formed message: not garbage
    core = ServerCore(ServerConfig(), X25519PrivateKey.generate())
    with pytest.raises(Rejected) as info:
        core.on_hello("10.0.0.1", data, 0, source="10.0.0.1:4000")
    assert info.value.code is ErrorCode.MALFORMED and info.value.reply is None
    assert core.counters.malformed == 1 and core.counters.refused == {"MALFORMED": 1}
    assert not core.sessions and core.pending == 0 and not core.connect_keys

    client = ClientHandshake(lambda key: None)
    client.start(0)
    hello = client.hello()
    assert client.on_reply(data) is None
    assert client.ignored_replies == 1 and client.state is ClientState.HELLO_SENT
    try:
        core.on_hello("10.0.0.1", hello, 0, source="10.0.0.1:4000")
    except Rejected as cookie:
        assert cookie.code is None
        assert client.on_reply(cookie.reply) is None
    session = core.on_hello("10.0.0.1", client.retry_hello, 0, source="10.0.0.1:4000")
    assert client.on_reply(data) is None and client.ignored_replies == 2
    assert client.on_reply(session.welcome) == session.details
    client.on_confirm(core.on_done(session, client.done()))
    assert client.state is ClientState.CONNECTED and core.counters.connected == 1


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=60))
def test_truncated_hello_only_raises_remote_protocol_error(cut: int) -> None:
    data = m.Hello(1, 99, KEY, True).encode()
    if cut >= len(data):
        return
    with pytest.raises(RemoteProtocolError):
        m.decode_message(data[:cut])

"""Handshake message codecs: round trips, strict decoding, garbage only raises the remote error."""

from __future__ import annotations

import msgpack
import pytest
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.errors import RemoteProtocolError
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=1200))
def test_garbage_only_raises_remote_protocol_error(data: bytes) -> None:
    try:
        m.decode_message(data)
    except RemoteProtocolError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=60))
def test_truncated_hello_only_raises_remote_protocol_error(cut: int) -> None:
    data = m.Hello(1, 99, KEY, True).encode()
    if cut >= len(data):
        return
    with pytest.raises(RemoteProtocolError):
        m.decode_message(data[:cut])

"""Key agreement and sealed frames: both sides agree; tampering, replay, reordering are refused."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.handshake import messages as m
from aeron_spark.handshake.crypto import (
    COUNTER_LENGTH,
    KEEP_BUFFER_BYTES,
    SEAL_OVERHEAD,
    SealCounters,
    client_keys,
    public_bytes,
    server_keys,
)
from aeron_spark.handshake.errors import RemoteProtocolError


def _agree() -> tuple:
    static, ephemeral, client, identity = (X25519PrivateKey.generate() for _ in range(4))
    hello = m.Hello(1, 5, public_bytes(client), True).encode()
    server = server_keys(static, ephemeral, public_bytes(client), public_bytes(identity), hello)
    mine = client_keys(client, identity, hello, public_bytes(static), public_bytes(ephemeral))
    return server, mine


def test_both_sides_derive_the_same_keys() -> None:
    server, client = _agree()
    assert server == client
    assert len({server.c2s_key, server.s2c_key, server.handshake_key}) == 3
    assert client.open_details(server.seal_details(b"details")) == b"details"
    assert server.done_proof() == client.done_proof() != client.confirm_proof()


def test_a_different_server_key_gives_different_keys() -> None:
    static, ephemeral, client, impostor, identity = (X25519PrivateKey.generate() for _ in range(5))
    hello = m.Hello(1, 5, public_bytes(client), True).encode()
    # The impostor claims the real server's static key but cannot compute dh2 with it.
    fake = server_keys(impostor, ephemeral, public_bytes(client), public_bytes(identity), hello)
    mine = client_keys(client, identity, hello, public_bytes(static), public_bytes(ephemeral))
    with pytest.raises(RemoteProtocolError, match="authenticate"):
        mine.open_details(fake.seal_details(b"details"))


def test_sealed_frames_in_order_open() -> None:
    server, client = _agree()
    counters = SealCounters()
    sealer, _ = client.client_sealer(SealCounters())
    _, opener = server.server_sealer(counters)
    for i in range(100):
        assert opener.open(sealer.seal(b"frame %d" % i)) == b"frame %d" % i
    assert counters.opened == 100 and counters.rejected() == 0


def test_tampered_replayed_reordered_and_truncated_frames_are_rejected_and_counted() -> None:
    server, client = _agree()
    counters = SealCounters()
    sealer, _ = client.client_sealer(SealCounters())
    _, opener = server.server_sealer(counters)
    first, second, third = (sealer.seal(b"m%d" % i) for i in range(3))
    tampered = bytearray(first)
    tampered[-1] ^= 1
    with pytest.raises(RemoteProtocolError, match="authentication"):
        opener.open(bytes(tampered))
    with pytest.raises(RemoteProtocolError, match="out-of-order"):
        opener.open(second)
    assert opener.open(first) == b"m0"
    with pytest.raises(RemoteProtocolError, match="replayed"):
        opener.open(first)
    with pytest.raises(RemoteProtocolError, match="too short"):
        opener.open(b"123")
    assert opener.open(second) == b"m1" and opener.open(third) == b"m2"
    assert (counters.tampered, counters.reordered, counters.replayed, counters.truncated) == (
        1,
        1,
        1,
        1,
    )


def test_a_frame_sealed_for_the_other_direction_does_not_open() -> None:
    server, client = _agree()
    sealer, _ = client.client_sealer(SealCounters())
    _, client_opener = client.client_sealer(SealCounters())
    with pytest.raises(RemoteProtocolError):
        client_opener.open(sealer.seal(b"reflected"))


def test_low_order_public_key_is_a_protocol_error() -> None:
    static, ephemeral = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    with pytest.raises(RemoteProtocolError):
        server_keys(static, ephemeral, bytes(32), public_bytes(static), b"hello")
    with pytest.raises(RemoteProtocolError):
        server_keys(static, ephemeral, public_bytes(ephemeral), bytes(32), b"hello")


def test_frames_sealed_into_buffers_open_into_buffers_and_refusals_are_counted() -> None:
    server, client = _agree()
    counters = SealCounters()
    sealer, _ = client.client_sealer(SealCounters())
    _, opener = server.server_sealer(counters)
    out = bytearray(64)
    first = bytes(sealer.seal_frame(0, b"m0"))
    second = bytes(sealer.seal_frame(0, b"m1"))
    tampered = bytearray(second)
    tampered[COUNTER_LENGTH] ^= 1
    with pytest.raises(RemoteProtocolError, match="out-of-order"):
        opener.open_into(second, out)
    assert opener.open_into(first, out) == 3 and out[:3] == b"\x00m0"
    with pytest.raises(RemoteProtocolError, match="replayed"):
        opener.open_into(first, out)
    out[:] = b"\xff" * len(out)
    with pytest.raises(RemoteProtocolError, match="authentication"):
        opener.open_into(bytes(tampered), out)
    assert out[:3] == bytes(3)  # no unauthenticated plaintext left behind
    with pytest.raises(RemoteProtocolError, match="too short"):
        opener.open_into(b"123", out)
    with pytest.raises(ValueError, match="does not fit"):
        opener.open_into(second, bytearray(2))
    assert opener.open_into(second, out) == 3 and out[:3] == b"\x00m1"
    assert (counters.tampered, counters.reordered, counters.replayed, counters.truncated) == (
        1,
        1,
        1,
        1,
    )
    assert counters.opened == 2
    with pytest.raises(ValueError, match="does not fit"):
        sealer.seal_into(b"frame", bytearray(5 + SEAL_OVERHEAD - 1))
    assert sealer.counter == 2  # a frame that did not fit took no counter


def test_a_sealed_frame_is_valid_until_the_next_and_large_frames_are_not_kept() -> None:
    server, client = _agree()
    sealer, _ = client.client_sealer(SealCounters())
    _, opener = server.server_sealer(SealCounters())
    small = sealer.seal_frame(0, b"a" * 100)
    assert opener.open(small) == b"\x00" + b"a" * 100
    large_body = b"b" * (KEEP_BUFFER_BYTES + 1)
    large = sealer.seal_frame(0, large_body)
    assert opener.open(large) == b"\x00" + large_body
    # the large frame had buffers of its own: the kept ones are still the small ones
    again = sealer.seal_frame(0, b"c" * 100)
    assert len(large) == len(large_body) + 1 + SEAL_OVERHEAD
    assert opener.open(again) == b"\x00" + b"c" * 100
    assert again.obj is small.obj

"""Key agreement and sealed frames: both sides agree; tampering, replay, reordering are refused."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.handshake import messages as m
from aeron_spark.handshake.crypto import (
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

"""Issue 22, items 4, 8 and 9: IPv4-mapped addresses meet IPv4 deny ranges, a client that asked
for sealing refuses an unsealed session, and the first sealed frame that fails authentication
closes the connection (and says why)."""

from __future__ import annotations

import dataclasses
import os
import socket

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.errors import (
    AddressDeniedError,
    ConnectionClosedError,
    EncryptionRequiredError,
    ErrorCode,
)
from aeron_spark.handshake.machine import ClientHandshake, ClientState, Rejected, ServerCore

from .conftest import wait_for


def _admit(core: ServerCore, address: str, client: ClientHandshake, now: int = 0):
    """HELLO, the cookie round trip when the server asks for it, and the admitted session."""
    hello = client.hello() if client.state is ClientState.JOINING else client._hello
    try:
        return core.on_hello(address, hello, now, source=f"{address}:4000")
    except Rejected as challenge:
        assert challenge.code is None and challenge.reply is not None, challenge
        assert client.on_reply(challenge.reply) is None
        assert client.retry_hello is not None
        return core.on_hello(address, client.retry_hello, now, source=f"{address}:4000")


def _client(**kw: object) -> ClientHandshake:
    client = ClientHandshake(lambda key: None, **kw)  # type: ignore[arg-type]
    client.start(0)
    return client


# ------------------------------------------------------------------ item 4: IPv4-mapped


def test_ipv4_mapped_addresses_are_checked_against_ipv4_ranges_and_limits() -> None:
    core = ServerCore(
        ServerConfig(host="::", deny=("127.0.0.0/8",), allow=("10.0.0.0/8", "127.0.0.0/8")),
        X25519PrivateKey.generate(),
    )
    assert not core.address_allowed("::ffff:127.0.0.1")
    assert not core.address_allowed("[::ffff:127.0.0.1]")
    assert core.address_allowed("::ffff:10.1.2.3")
    with pytest.raises(Rejected) as refused:
        core.on_hello("::ffff:127.0.0.1", _client().hello(), 0, source="[::ffff:127.0.0.1]:5")
    assert refused.value.code is ErrorCode.ADDRESS_DENIED
    session = _admit(core, "::ffff:10.1.2.3", _client())
    assert session.address == "10.1.2.3"  # one key for the mapped and the plain form
    assert core.per_address["10.1.2.3"] == 1
    # A range written in the mapped form matches the plain IPv4 address as well.
    mapped_deny = ServerCore(
        ServerConfig(host="::", deny=("::ffff:10.6.0.0/112",)), X25519PrivateKey.generate()
    )
    assert not mapped_deny.address_allowed("10.6.1.2")
    assert not mapped_deny.address_allowed("::ffff:10.6.1.2")
    assert mapped_deny.address_allowed("10.7.1.2")


def _dual_stack() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            probe.bind(("::", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _dual_stack(), reason="no dual-stack IPv6 socket on this machine")
def test_deny_127_refuses_an_ipv4_client_of_a_server_on_all_ipv6_addresses(
    make_server, make_client
) -> None:
    server = make_server(host="::", deny=("127.0.0.0/8",), ipc=False)
    with pytest.raises(AddressDeniedError, match="127.0.0.1"):
        make_client(timeout_s=5.0).connect(f"127.0.0.1:{server.port}")
    assert server.stats()["refused"].get("ADDRESS_DENIED", 0) >= 1
    assert server.stats()["connected"] == 0


# ------------------------------------------------------------------ item 8: no unsealed session


def test_client_that_asked_for_sealing_refuses_an_unsealed_session() -> None:
    core = ServerCore(ServerConfig(), X25519PrivateKey.generate())
    client = _client(encryption=True)
    session = _admit(core, "10.0.0.1", client)
    welcome = m.decode_message(session.welcome)
    assert isinstance(welcome, m.Welcome)
    plain = dataclasses.replace(session.details, encryption=False)
    # Only the key holder can seal this: the server itself offers a plain session.
    forged = m.Welcome(
        welcome.connect_key,
        welcome.server_key,
        welcome.ephemeral_key,
        session.keys.seal_details(plain.encode()),
    ).encode()
    with pytest.raises(EncryptionRequiredError, match="encryption=false") as refused:
        client.on_reply(forged)
    assert refused.value.code is ErrorCode.ENCRYPTION_REQUIRED
    assert client.state is ClientState.FAILED and client.keys is None


# ------------------------------------------------------------------ item 9: close on a bad frame


def _bad_frame(counter: int) -> bytes:
    return counter.to_bytes(8, "big") + os.urandom(1 + 16)


def test_a_forged_frame_from_the_client_side_closes_the_session_on_the_server(
    make_server, make_client
) -> None:
    errors: list[BaseException] = []
    server = make_server()
    conn = make_client().connect(server.endpoint)
    conn.send(b"before")
    assert conn.receive(30.0) == b"before"
    wait_for(lambda: len(server.connections) == 1, what="the server side")
    server_conn = server.connections[0]
    server_conn.on_error = lambda c, exc: errors.append(exc)
    # A frame with the next counter but a forged tag, on the session's own stream (session id
    # and stream id from the live objects), delivered by the transport like any other.
    assert conn.publication.offer(_bad_frame(conn._sealer.counter)) > 0
    wait_for(lambda: server.stats()["frames_rejected"] >= 1, what="the forged frame counted")
    wait_for(lambda: server.stats()["connections"] == 0, what="the server to close the session")
    assert not server_conn.is_connected
    assert server_conn.close_reason is not None and "authentication" in server_conn.close_reason
    assert errors and "authentication" in str(errors[0])
    wait_for(lambda: not conn.is_connected, what="the client to see the session closed")
    conn.close()


def test_a_forged_frame_from_the_server_side_closes_the_clients_connection(
    make_server, make_client
) -> None:
    server = make_server(echo=False)
    conn = make_client().connect(server.endpoint)
    wait_for(lambda: len(server.connections) == 1, what="the server side")
    server_conn = server.connections[0]
    assert server_conn.publication.offer(_bad_frame(server_conn._sealer.counter)) > 0
    server_conn.send(b"after the forged frame")  # valid, but a session that was tampered with
    wait_for(lambda: conn.receive(0.05) is None and not conn.is_connected, what="the close")
    assert conn.seal_counters.rejected() == 1
    assert "authentication" in (conn.close_reason or "")
    with pytest.raises(ConnectionClosedError, match="authentication"):
        conn.send(b"x")
    conn.close()

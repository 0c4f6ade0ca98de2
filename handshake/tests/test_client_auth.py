"""Issue 19, item 2: mutual authentication in the handshake (protocol version 3).

The client identity hidden from observers and checked before any allocation; a recorded second
HELLO replayed by someone else (in memory with a manual clock, and as raw UDP datagrams) gets
nothing usable. The known-answer test of the version 3 key schedule (identity box and the four
X25519 results, computed independently) is test_key_schedule_vectors.py."""

from __future__ import annotations

import socket
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from aeron_spark.handshake import Client, ClientConfig, Server, ServerConfig
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.client import _Attempt
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID
from aeron_spark.handshake.crypto import (
    _identity_aead,
    client_keys,
    open_identity,
    public_bytes,
    seal_identity,
)
from aeron_spark.handshake.errors import (
    ClientUnknownError,
    ErrorCode,
    HandshakeError,
    RemoteProtocolError,
)
from aeron_spark.handshake.machine import ClientHandshake, Rejected, ServerCore
from aeron_spark.transport.protocol.frames import DataFlags, FrameType, SetupFrame
from aeron_spark.transport.protocol.term import encode_data_header

from .conftest import wait_for

S = 1_000_000_000


def _fixed(byte: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(bytes([byte]) * 32)


def test_the_identity_box_opens_only_with_its_cookie_and_server_key() -> None:
    ce, cs, ss = _fixed(1), _fixed(2), _fixed(3)
    box = seal_identity(ce, cs, public_bytes(ss), 7, bytes(16))
    assert open_identity(ss, public_bytes(ce), 7, bytes(16), box) == public_bytes(cs)
    assert public_bytes(cs) not in box  # an observer does not see the client key
    with pytest.raises(RemoteProtocolError, match="identity does not authenticate"):
        open_identity(ss, public_bytes(ce), 7, bytes([1]) * 16, box)  # another cookie
    with pytest.raises(RemoteProtocolError, match="identity does not authenticate"):
        open_identity(_fixed(9), public_bytes(ce), 7, bytes(16), box)  # another server
    with pytest.raises(RemoteProtocolError, match="identity does not authenticate"):
        open_identity(ss, public_bytes(ce), 8, bytes(16), box)  # another connect key


def test_an_identity_box_with_a_public_key_and_no_proof_of_its_private_key_does_not_open() -> None:
    # Issue 28 item 8: the box held only the client's public key, so a HELLO naming a listed
    # client's public key (public: it is in the authorized keys file) was admitted.
    ce, cs, ss = _fixed(1), _fixed(2), _fixed(3)
    aead, ad = _identity_aead(
        ce.exchange(ss.public_key()), 7, public_bytes(ce), public_bytes(ss), bytes(16)
    )
    for proof in (bytes(16), seal_identity(ce, _fixed(4), public_bytes(ss), 7, bytes(16))[:16]):
        forged = aead.encrypt(bytes(12), public_bytes(cs) + proof, ad)
        with pytest.raises(RemoteProtocolError, match="no proof of its private key"):
            open_identity(ss, public_bytes(ce), 7, bytes(16), forged)


def _core(allowed: set[bytes] | None) -> ServerCore:
    authorize = None if allowed is None else allowed.__contains__
    return ServerCore(ServerConfig(), X25519PrivateKey.generate(), authorize=authorize)


def _second_hello(core: ServerCore, client: ClientHandshake, source: str, now: int) -> bytes:
    address = source.rpartition(":")[0]
    with pytest.raises(Rejected) as cookie:
        core.on_hello(address, client.hello(), now, source=source)
    assert cookie.value.code is None
    client.on_reply(cookie.value.reply)
    assert client.retry_hello is not None
    return client.retry_hello


def test_an_unlisted_client_key_is_refused_before_anything_is_allocated() -> None:
    listed = X25519PrivateKey.generate()
    core = _core({public_bytes(listed)})
    stranger = ClientHandshake(lambda key: None, static_key=X25519PrivateKey.generate())
    stranger.start(0)
    hello = _second_hello(core, stranger, "10.0.0.1:4000", 0)
    with pytest.raises(Rejected) as refused:
        core.on_hello("10.0.0.1", hello, 0, source="10.0.0.1:4000")
    assert refused.value.code is ErrorCode.CLIENT_UNKNOWN
    with pytest.raises(ClientUnknownError, match="CLIENT_UNKNOWN.*not authorised"):
        stranger.on_reply(refused.value.reply)
    assert not core.sessions and not core.session_ids and not core.stream_ids
    assert not core.connect_keys and core.pending == 0 and core.counters.accepted == 0
    assert core.counters.clients_refused == 1 and core.counters.refused["CLIENT_UNKNOWN"] == 1
    # the listed key is admitted, and the session knows which key it is
    friend = ClientHandshake(lambda key: None, static_key=listed)
    friend.start(0)
    hello = _second_hello(core, friend, "10.0.0.1:4001", 0)
    session = core.on_hello("10.0.0.1", hello, 0, source="10.0.0.1:4001")
    assert session.client_key == public_bytes(listed)
    friend.on_reply(session.welcome)
    friend.on_confirm(core.on_done(session, friend.done()))


def test_a_replayed_second_hello_gets_nothing_usable() -> None:
    listed = X25519PrivateKey.generate()
    core = _core({public_bytes(listed)})
    honest = ClientHandshake(lambda key: None, static_key=listed)
    honest.start(0)
    recorded = _second_hello(core, honest, "10.0.0.1:4000", 0)
    session = core.on_hello("10.0.0.1", recorded, 0, source="10.0.0.1:4000")
    honest.on_reply(session.welcome)
    honest.on_confirm(core.on_done(session, honest.done()))
    core.release(session)

    # 1. From another address or port: the cookie is not valid there -> a COOKIE, nothing else.
    with pytest.raises(Rejected) as answer:
        core.on_hello("10.9.9.9", recorded, 1 * S, source="10.9.9.9:666")
    assert answer.value.code is None and core.counters.cookies_bad == 1
    # 2. With that fresh cookie put in: the identity box is bound to the old cookie.
    fresh = m.decode_message(answer.value.reply).cookie  # type: ignore[union-attr]
    old = m.decode_message(recorded)
    assert isinstance(old, m.Hello)
    forged = m.Hello(
        old.version, old.connect_key, old.public_key, old.encryption, fresh, old.identity
    ).encode()
    with pytest.raises(Rejected) as answer:
        core.on_hello("10.9.9.9", forged, 1 * S, source="10.9.9.9:666")
    assert answer.value.code is ErrorCode.MALFORMED and core.counters.identities_bad == 1
    # 3. Spoofing the honest source within the cookie's time: its cookie was spent by the
    #    honest HELLO (protocol version 5): a COOKIE, nothing allocated.
    accepted = core.counters.accepted
    with pytest.raises(Rejected) as answer:
        core.on_hello("10.0.0.1", recorded, 2 * S, source="10.0.0.1:4000")
    assert answer.value.code is None and core.counters.cookies_reused == 1
    assert core.counters.accepted == accepted and core.pending == 0
    # (had it been admitted: a WELCOME nobody but the honest client can open, and no DONE the
    # attacker can make, lacking ce and cs)
    welcome = m.decode_message(session.welcome)
    assert isinstance(welcome, m.Welcome)
    guess_ce, guess_cs = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    guessed = client_keys(guess_ce, guess_cs, recorded, welcome.server_key, welcome.ephemeral_key)
    with pytest.raises(RemoteProtocolError):
        guessed.open_details(welcome.box)
    # 4. After the cookie's time (10-20 s): only a COOKIE again.
    with pytest.raises(Rejected) as answer:
        core.on_hello("10.0.0.1", recorded, 25 * S, source="10.0.0.1:4000")
    assert answer.value.code is None


# ------------------------------------------------------------------ over the network


def test_a_recorded_handshake_replayed_as_raw_udp_gets_nothing(tmp_path) -> None:
    key_dir = str(tmp_path / "client")
    client = Client(ClientConfig(key_store_dir=key_dir, timeout_s=10))
    listed = public_bytes(client.static_key)
    server = Server(
        ServerConfig(key_store_dir=str(tmp_path / "server"), ipc=False),
        authorize={listed}.__contains__,
        on_message=lambda c, msg: c.send(msg),
    ).start()
    recorded: list[bytes] = []
    original = _Attempt._say

    def record(self, channel, hello):  # type: ignore[no-untyped-def]
        recorded.append(hello)  # the first HELLO, then the one with the cookie
        return original(self, channel, hello)

    _Attempt._say = record  # type: ignore[method-assign]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with client.connect(server.endpoint) as conn:
            conn.send(b"honest")
            assert conn.receive(30) == b"honest"
        _Attempt._say = original  # type: ignore[method-assign]
        assert len(recorded) == 2
        wait_for(lambda: server.stats()["connections"] == 0, what="the honest session closed")
        before = server.stats()
        # The attacker sends the recorded second HELLO from its own socket, as Aeron frames.
        sock.bind(("127.0.0.1", 0))
        session_id = 0x0F00BA12
        setup = SetupFrame(0, session_id, HANDSHAKE_STREAM_ID, 7, 7, 64 * 1024, 1408)
        data = (
            encode_data_header(
                32 + len(recorded[1]),
                DataFlags.UNFRAGMENTED,
                FrameType.DATA,
                0,
                session_id,
                HANDSHAKE_STREAM_ID,
                7,
            )
            + recorded[1]
        )
        for _ in range(3):
            sock.sendto(setup.encode(), ("127.0.0.1", server.port))
            sock.sendto(data, ("127.0.0.1", server.port))
            time.sleep(0.05)

        # until the replayed HELLO's handling is over (answered with a COOKIE, or admitted): a
        # snapshot taken once its HELLO was counted may come before its cookie was judged
        def handled() -> bool:
            s = server.stats()
            return s["hellos"] > before["hellos"] and (
                s["cookies_sent"] > before["cookies_sent"]
                or s["accepted"] > before["accepted"]
                or s["pending"] > 0
            )

        wait_for(handled, what="the replay read and answered")
        after = server.stats()
        assert after["cookies_bad"] == before["cookies_bad"] + 1  # bound to another port
        assert after["accepted"] == before["accepted"] and after["pending"] == 0
        assert after["connected"] == before["connected"] and after["connections"] == 0
    finally:
        _Attempt._say = original  # type: ignore[method-assign]
        sock.close()
        server.close()


def test_a_hello_naming_a_listed_public_key_without_its_private_key_allocates_nothing(
    tmp_path, monkeypatch
) -> None:
    # Issue 28 item 8, over UDP: an attacker at its own address seals a listed client's
    # *public* key (anyone may read it) in its identity box. It got pending sessions (32 per
    # /24) on the old server; now its box carries no proof of the private key: refused.
    from aeron_spark.handshake import machine as hm

    listed = public_bytes(X25519PrivateKey.generate())
    server = Server(
        ServerConfig(key_store_dir=str(tmp_path / "server"), ipc=False),
        authorize={listed}.__contains__,
    ).start()

    def forge(ephemeral, _own_key, server_key, connect_key, cookie):  # type: ignore[no-untyped-def]
        aead, ad = _identity_aead(
            ephemeral.exchange(X25519PublicKey.from_public_bytes(server_key)),
            connect_key,
            public_bytes(ephemeral),
            server_key,
            cookie,
        )
        filler = bytes(m.IDENTITY_LENGTH - 16 - 32)  # a made-up proof (none before version 5)
        return aead.encrypt(bytes(12), listed + filler, ad)

    if hasattr(hm, "seal_identity_keeping"):
        monkeypatch.setattr(hm, "seal_identity_keeping", lambda *a: (forge(*a), None))
    else:  # the code before version 5
        monkeypatch.setattr(hm, "seal_identity", forge)
    attacker = Client(ClientConfig(key_store_dir=str(tmp_path / "attacker"), timeout_s=3))
    try:
        for _ in range(3):
            with pytest.raises(HandshakeError):
                attacker.connect(server.endpoint).close()
        stats = server.stats()
        assert stats["accepted"] == 0 and stats["pending"] == 0, stats
        assert stats["identities_bad"] == 3 and stats["refused"] == {"MALFORMED": 3}
    finally:
        server.close()

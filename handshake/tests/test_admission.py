"""Issue 22, items 5 and 6: one host (or one network) cannot fill the server's pending
handshakes, and a HELLO allocates nothing until its sender has shown it receives at its address
(the stateless COOKIE round trip); HELLOs per /24 or /64 are rate limited."""

from __future__ import annotations

import os
import socket
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.errors import ConfigurationError
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID, REPLY_STREAM_ID, ServerConfig
from aeron_spark.handshake.crypto import fingerprint, public_bytes
from aeron_spark.handshake.errors import ErrorCode
from aeron_spark.handshake.machine import ClientHandshake, Rejected, ServerCore, SessionEvent
from aeron_spark.transport.protocol.frames import DataFlags, FrameType, SetupFrame
from aeron_spark.transport.protocol.term import encode_data_header

from .conftest import wait_for

S = 1_000_000_000


def _core(**kw: object) -> ServerCore:
    return ServerCore(ServerConfig(**kw), X25519PrivateKey.generate())  # type: ignore[arg-type]


def _client() -> ClientHandshake:
    client = ClientHandshake(lambda key: None)
    client.start(0)
    return client


def _nothing_allocated(core: ServerCore) -> None:
    assert not core.sessions and not core.session_ids and not core.stream_ids
    assert not core.connect_keys and not core.per_address and core.pending == 0
    assert core.counters.accepted == 0


def _admit(core: ServerCore, address: str, port: int = 4000, now: int = 0):
    client = _client()
    hello = client.hello()
    source = f"{address}:{port}"
    with pytest.raises(Rejected) as challenge:
        core.on_hello(address, hello, now, source=source)
    assert challenge.value.code is None
    client.on_reply(challenge.value.reply)
    return core.on_hello(address, client.retry_hello, now, source=source)


def test_hellos_without_a_valid_cookie_allocate_nothing() -> None:
    core = _core()
    clients = [_client() for _ in range(300)]
    cookies = []
    for client in clients:
        with pytest.raises(Rejected) as answer:
            core.on_hello("10.0.0.1", client.hello(), 0, source="10.0.0.1:5000")
        assert answer.value.code is None  # a COOKIE, not a refusal
        cookie = m.decode_message(answer.value.reply)
        assert isinstance(cookie, m.Cookie) and cookie.connect_key == client.connect_key
        assert len(answer.value.reply) < len(client._hello)  # never more bytes than it got
        cookies.append(cookie.cookie)
    _nothing_allocated(core)
    assert core.counters.cookies_sent == 300 and core.pending_per_prefix == {}

    # A forged cookie, one for another port or address, one past its time: answered with a fresh
    # COOKIE, still allocating nothing.
    victim = clients[0]
    pk = victim._hello and m.decode_message(victim._hello).public_key
    forged = m.Hello(m.PROTOCOL_VERSION, victim.connect_key, pk, True, os.urandom(16)).encode()
    victim.on_reply(m.Cookie(victim.connect_key, cookies[0], core.static_public).encode())
    real = victim.retry_hello  # with the cookie and the sealed client identity (version 3)
    assert real is not None and m.decode_message(real).public_key == pk
    for data, source, now in (
        (forged, "10.0.0.1:5000", 0),
        (real, "10.0.0.1:5001", 0),
        (real, "10.0.0.2:5000", 0),
        (real, "10.0.0.1:5000", 25 * S),
    ):
        address = source.rpartition(":")[0]
        with pytest.raises(Rejected) as answer:
            core.on_hello(address, data, now, source=source)
        assert answer.value.code is None
    assert core.counters.cookies_bad == 4
    _nothing_allocated(core)
    # The same cookie from the address and port it was made for, within its time: admitted.
    session = core.on_hello("10.0.0.1", real, 5 * S, source="10.0.0.1:5000")
    assert session.address == "10.0.0.1" and core.pending == 1


def test_pending_handshakes_are_limited_per_24_and_per_64_far_below_the_total() -> None:
    core = _core(max_pending=256, max_per_address=256)
    assert core.config.max_pending_per_prefix == 32  # far below max_pending
    for i in range(32):
        _admit(core, f"10.0.0.{i + 1}")  # many hosts of one /24
    for address in ("10.0.0.1", "10.0.0.200"):
        with pytest.raises(Rejected) as refused:
            _admit(core, address)
        # a moment's limit, retried by clients (TOO_MANY_FROM_ADDRESS is for connections)
        assert refused.value.code is ErrorCode.TOO_MANY_PENDING
        assert b"10.0.0.0/24" in refused.value.reply
    _admit(core, "10.0.1.1")  # the next /24 is not held back
    assert core.pending_per_prefix == {"10.0.0.0/24": 32, "10.0.1.0/24": 1}
    for i in range(32):
        _admit(core, f"2001:db8::{i + 1:x}")
    with pytest.raises(Rejected) as refused:
        _admit(core, "2001:db8::ffff:1")  # the same /64
    assert refused.value.code is ErrorCode.TOO_MANY_PENDING
    _admit(core, "2001:db8:0:1::1")
    # A session that completes or ends gives its slot back.
    session = next(s for s in core.sessions if s.address == "10.0.0.5")
    core.release(session)
    _admit(core, "10.0.0.99")
    for session in list(core.sessions):
        core.release(session)
    assert core.pending == 0 and not core.pending_per_prefix


def _admit_as(core: ServerCore, key: X25519PrivateKey, address: str, now: int):
    client = ClientHandshake(lambda spk: None, static_key=key)
    client.start(now)
    source = f"{address}:4000"
    with pytest.raises(Rejected) as challenge:
        core.on_hello(address, client.hello(), now, source=source)
    client.on_reply(challenge.value.reply)
    return core.on_hello(address, client.retry_hello, now, source=source)


def test_one_client_key_holds_at_most_its_share_of_the_sessions() -> None:
    hog, other = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    listed = {public_bytes(hog), public_bytes(other)}
    config = ServerConfig(max_clients=8, handshake_timeout_ns=10 * S)
    assert config.key_limit == 4  # default: half of max_clients
    core = ServerCore(config, X25519PrivateKey.generate(), authorize=listed.__contains__)
    now = 0
    for i in range(4):  # from four addresses: the per-address limit does not stop it
        _admit_as(core, hog, f"10.0.{i}.1", now)
    with pytest.raises(Rejected) as refused:
        _admit_as(core, hog, "10.0.9.1", now)
    assert refused.value.code is ErrorCode.TOO_MANY_FOR_KEY
    refuse = m.decode_message(refused.value.reply)
    assert isinstance(refuse, m.Refuse) and refuse.code == ErrorCode.TOO_MANY_FOR_KEY
    assert fingerprint(public_bytes(hog)) in refuse.message and "4 sessions" in refuse.message
    assert core.counters.refused == {"TOO_MANY_FOR_KEY": 1}
    assert len(core.sessions) == 4 and core.per_key[public_bytes(hog)] == 4  # nothing allocated
    for i in range(4):  # another key takes the other half
        _admit_as(core, other, f"10.1.{i}.1", now)
    assert core.per_key == {public_bytes(hog): 4, public_bytes(other): 4}
    # The hog's pending handshakes expire on the (manual) clock: its share comes back.
    now += 10 * S
    for session in core.expired(now):
        core.release(session, SessionEvent.TIMEOUT)
    assert not core.per_key and not core.sessions
    _admit_as(core, hog, "10.0.9.1", now)
    assert core.per_key == {public_bytes(hog): 1}


def test_the_per_key_limit_is_set_and_applies_only_with_client_keys() -> None:
    key = X25519PrivateKey.generate()
    strict = ServerCore(
        ServerConfig(max_clients=8, max_per_key=2),
        X25519PrivateKey.generate(),
        authorize={public_bytes(key)}.__contains__,
    )
    _admit_as(strict, key, "10.0.0.1", 0)
    _admit_as(strict, key, "10.0.0.2", 0)
    with pytest.raises(Rejected) as refused:
        _admit_as(strict, key, "10.0.0.3", 0)
    assert refused.value.code is ErrorCode.TOO_MANY_FOR_KEY
    # Without authorised keys a client may make a key per session: no per-key limit applies.
    core = _core(max_clients=8, max_per_key=2)
    for i in range(8):
        _admit_as(core, key, f"10.0.0.{i + 1}", 0)
    with pytest.raises(Rejected) as refused:
        _admit_as(core, key, "10.0.0.9", 0)
    assert refused.value.code is ErrorCode.SERVER_FULL
    for session in list(core.sessions):
        core.release(session)
    assert not core.per_key
    assert ServerConfig(max_clients=1).key_limit == 1
    for bad in (0, -1):
        with pytest.raises(ConfigurationError, match="max_per_key"):
            ServerConfig(max_per_key=bad)


def test_an_ipv6_host_cannot_pass_the_address_limit_by_picking_addresses_of_its_64() -> None:
    """Any one IPv6 host may use as many source addresses of its /64 as it likes: counted per
    address, each of its sessions came from a fresh one and the address limit bounded nothing
    (with sessions kept alive by their transport, issue 31, one host without a listed key
    could hold the whole server). Counted per /64, as the pending handshakes and dedicated
    sockets are; IPv4 (and IPv4-mapped) addresses stay one each."""
    core = _core(max_clients=64, max_per_address=3, max_pending_per_prefix=64)
    for i in range(3):
        _admit(core, f"2001:db8:0:7::{i + 1:x}")
    with pytest.raises(Rejected) as refused:
        _admit(core, "2001:db8:0:7:ffff:1:2:3")  # another address of the same /64
    assert refused.value.code is ErrorCode.TOO_MANY_FROM_ADDRESS
    refuse = m.decode_message(refused.value.reply)
    assert isinstance(refuse, m.Refuse) and "2001:db8:0:7::/64" in refuse.message
    _admit(core, "2001:db8:0:8::1")  # the next /64 is another network
    for i in range(3):  # IPv4: per address, as before (a /24 is many hosts)
        _admit(core, "10.0.0.1")
        _admit(core, f"10.0.0.{i + 2}")
    with pytest.raises(Rejected) as refused:
        _admit(core, "::ffff:10.0.0.1")  # the IPv4 address it maps
    assert refused.value.code is ErrorCode.TOO_MANY_FROM_ADDRESS
    for session in list(core.sessions):
        core.release(session)
    assert not core.per_address  # every share given back
    _admit(core, "2001:db8:0:7::9")


def test_hellos_per_network_are_rate_limited_answered_busy_then_silently_and_counted() -> None:
    """Past its rate a network's HELLOs are answered "busy" (REFUSE TOO_MANY_PENDING: the
    client backs off instead of waiting out its timeout), never with more bytes than the HELLO
    and at most as many a second as HELLOs are admitted; past that, silence. Nothing is kept."""
    core = _core(hellos_per_prefix_per_s=10)
    answers = []
    hellos = []
    for _ in range(25):
        hello = _client().hello()
        hellos.append(hello)
        try:
            core.on_hello("10.0.0.1", hello, 0, source="10.0.0.1:1")
        except Rejected as answer:
            answers.append(answer)
    assert [a.code for a in answers[:10]] == [None] * 10  # COOKIEs
    busy = answers[10:20]
    assert [a.code for a in busy] == [ErrorCode.TOO_MANY_PENDING] * 10
    for answer, hello in zip(busy, hellos[10:20], strict=True):
        assert answer.reply is not None and len(answer.reply) <= len(hello)  # no amplification
        refuse = m.decode_message(answer.reply)
        assert isinstance(refuse, m.Refuse) and refuse.code == ErrorCode.TOO_MANY_PENDING
        assert refuse.connect_key == m.decode_message(hello).connect_key
    assert all(a.reply is None for a in answers[20:])  # the busy answers' own rate: dropped
    assert core.counters.rate_limited == 15 and core.counters.cookies_sent == 10
    assert core.counters.rate_limited_answered == 10
    with pytest.raises(Rejected) as other:
        core.on_hello("10.0.1.1", _client().hello(), 0, source="10.0.1.1:1")
    assert other.value.code is None  # another /24 has its own budget
    with pytest.raises(Rejected) as later:
        core.on_hello("10.0.0.1", _client().hello(), S // 10, source="10.0.0.1:1")
    assert later.value.code is None  # refilled at 10 per second
    _nothing_allocated(core)


def test_a_hello_past_the_rate_is_not_answered_when_the_answer_is_longer() -> None:
    """A HELLO crafted shorter than the busy answer (no padding) gets silence, not a reply."""
    core = _core(hellos_per_prefix_per_s=1)
    with pytest.raises(Rejected):
        core.on_hello("10.0.0.1", _client().hello(), 0, source="10.0.0.1:1")
    bare = m.Hello(
        m.PROTOCOL_VERSION, 7, X25519PrivateKey.generate().public_key().public_bytes_raw(), False
    )
    short = m._pack(
        {"t": m.MessageType.HELLO, "v": bare.version, "ck": 7, "pk": bare.public_key, "enc": False}
    )
    with pytest.raises(Rejected) as dropped:
        core.on_hello("10.0.0.1", short, 0, source="10.0.0.1:1")
    assert dropped.value.reply is None
    assert core.counters.rate_limited == 1 and core.counters.rate_limited_answered == 0


# ------------------------------------------------------------------ over the network


def _raw_hellos(server_port: int, source_ip: str, sockets: int, per_socket: int) -> list:
    """HELLO publications crafted by hand (SETUP + one DATA frame each) from ``sockets``
    sockets bound to ``source_ip``: each never reads anything the server sends back."""
    socks = []
    for s in range(sockets):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((source_ip, 0))
        packets = []
        for k in range(per_socket):
            session_id = 0x0E000000 + s * 16 + k
            pk = X25519PrivateKey.generate().public_key().public_bytes_raw()
            hello = m.Hello(m.PROTOCOL_VERSION, session_id, pk, True).encode()
            setup = SetupFrame(0, session_id, HANDSHAKE_STREAM_ID, 7, 7, 64 * 1024, 1408)
            data = (
                encode_data_header(
                    32 + len(hello),
                    DataFlags.UNFRAGMENTED,
                    FrameType.DATA,
                    0,
                    session_id,
                    HANDSHAKE_STREAM_ID,
                    7,
                )
                + hello
            )
            packets += [setup.encode(), data]
        socks.append((sock, packets))
    for _ in range(3):  # the DATA frame again, in case it arrived before its image
        for sock, packets in socks:
            for packet in packets:
                sock.sendto(packet, ("127.0.0.1", server_port))
        time.sleep(0.05)
    return socks


def test_hundreds_of_hellos_from_one_host_do_not_lock_out_an_honest_client(
    make_server, make_client
) -> None:
    # The connector's limits: max_per_address = max_pending = 256.
    server = make_server(max_pending=256, max_per_address=256, ipc=False)
    pubs, subs = len(server.driver._publications), len(server.driver._subscriptions)
    socks = _raw_hellos(server.port, "127.0.0.2", sockets=80, per_socket=4)  # 320 HELLOs
    try:
        # a snapshot of the counters between a HELLO counted and its COOKIE sent reads one
        # more HELLO than COOKIEs (the run of 2026-11-27: 215 and 214): wait for a snapshot
        # where every HELLO read has had its COOKIE (never, were one missing or doubled)
        snapshots: list[dict] = []

        def answered() -> bool:
            snapshots.append(server.stats())
            return snapshots[-1]["hellos"] >= 200 and (
                snapshots[-1]["cookies_sent"] == snapshots[-1]["hellos"]
            )

        wait_for(answered, what="the flood's HELLOs read, each answered with one COOKIE")
        stats = snapshots[-1]
        assert stats["pending"] == 0 and stats["accepted"] == 0
        assert stats["cookies_sent"] == stats["hellos"]
        # nothing of a session: only each HELLO image's reply publication (issue 28 item 1),
        # as many as the HELLO images' caps let live
        added = server.driver._publications[pubs:]
        assert {p.stream_id for p in added} <= {REPLY_STREAM_ID}
        assert len(added) <= 2 * 256
        assert len(server.driver._subscriptions) == subs
        conn = make_client().connect(server.endpoint)  # from 127.0.0.1, meanwhile
        conn.send(b"honest")
        assert conn.receive(30.0) == b"honest"
        assert server.stats()["cookies_sent"] >= stats["hellos"] + 1
        conn.close()
    finally:
        for sock, _ in socks:
            sock.close()


def test_every_client_in_the_repository_goes_through_the_cookie(make_server, make_client) -> None:
    server = make_server()
    client = make_client()
    conn = client.connect(server.endpoint)
    conn.close()
    stats = server.stats()
    assert stats["cookies_sent"] == 1 and stats["cookies_bad"] == 0 and stats["connected"] == 1


def test_a_client_answers_a_few_cookies_then_ignores_them() -> None:
    # A stale cookie gets a fresh COOKIE; a client answers at most MAX_COOKIES of them, so
    # somebody who keeps sending it COOKIEs cannot keep it saying HELLO (it times out instead).
    from aeron_spark.handshake.machine import MAX_COOKIES

    client = _client()
    first = client.hello()
    for i in range(MAX_COOKIES + 2):
        cookie = m.Cookie(client.connect_key, bytes([i]) * 16, bytes(range(32))).encode()
        assert client.on_reply(cookie) is None
        if i < MAX_COOKIES:
            retry = m.decode_message(client.retry_hello)
            assert isinstance(retry, m.Hello) and retry.cookie == bytes([i]) * 16
            assert client._hello == client.retry_hello != first
            client.retry_hello = None
        else:
            assert client.retry_hello is None
    assert client.cookies == MAX_COOKIES and client.ignored_replies == 2
    other = m.Cookie(client.connect_key + 1, b"\0" * 16, bytes(range(32))).encode()
    assert client.on_reply(other) is None and client.ignored_replies == 3

"""The handshake state machines, sans-I/O: tables walked with hypothesis, a whole handshake in
memory with a manual clock, limits, expiry, spoofing and refusals."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.crypto import SealCounters
from aeron_spark.handshake.errors import (
    AddressDeniedError,
    HandshakeError,
    HandshakeTimeoutError,
    KeyRefusedError,
    LocalProtocolError,
    RemoteProtocolError,
    ServerFullError,
    TooManyConnectionsError,
    TooManyPendingError,
    UnsupportedVersionError,
    refusal,
)
from aeron_spark.handshake.machine import (
    CLIENT_TRANSITIONS,
    MIN_SESSION_STREAM_ID,
    RESERVED_SESSION_ID_HIGH,
    RESERVED_SESSION_ID_LOW,
    SESSION_TRANSITIONS,
    ClientEvent,
    ClientHandshake,
    ClientState,
    Rejected,
    ServerCore,
    ServerSession,
    SessionEvent,
    SessionState,
)

S = 1_000_000_000


def _core(**kw: object) -> ServerCore:
    return ServerCore(ServerConfig(**kw), X25519PrivateKey.generate())  # type: ignore[arg-type]


def _client(**kw: object) -> ClientHandshake:
    client = ClientHandshake(lambda key: None, **kw)  # type: ignore[arg-type]
    client.start(0)
    return client


def _admit(core: ServerCore, address: str, client: ClientHandshake, now: int = 0):
    """The client's HELLO and, when the server answers with a COOKIE, the HELLO again with it."""
    hello = client.hello() if client.state is ClientState.JOINING else client._hello
    try:
        return core.on_hello(address, hello, now, source=f"{address}:4000")
    except Rejected as answer:
        if answer.code is not None:
            raise
        assert client.on_reply(answer.reply) is None and client.retry_hello is not None
        hello, client.retry_hello = client.retry_hello, None
        return core.on_hello(address, hello, now, source=f"{address}:4000")


def _handshake(core: ServerCore, address: str = "10.0.0.1", now: int = 0):
    client = _client()
    session = _admit(core, address, client, now)
    details = client.on_reply(session.welcome)
    assert details == session.details
    confirm = core.on_done(session, client.done())
    client.on_confirm(confirm)
    return client, session


# ------------------------------------------------------------------ tables


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list(ClientEvent)), max_size=12))
def test_client_table_walk_only_follows_the_table_or_raises_protocol_errors(events) -> None:
    state = ClientState.IDLE
    machine = ClientHandshake(lambda key: None)
    for event in events:
        before = machine.state
        expected = CLIENT_TRANSITIONS.get((before, event))
        try:
            machine._fire(event)
        except (LocalProtocolError, RemoteProtocolError):
            assert expected is None
            assert machine.state is ClientState.FAILED
        else:
            assert machine.state is expected
        state = machine.state
    assert isinstance(state, ClientState)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list(SessionEvent)), max_size=8))
def test_session_table_walk(events) -> None:
    core = _core()
    session = _admit(core, "10.0.0.1", _client(), 0)
    for event in events:
        expected = SESSION_TRANSITIONS.get((session.state, event))
        try:
            session.fire(event)
        except (LocalProtocolError, RemoteProtocolError):
            assert expected is None and session.state is SessionState.CLOSED
        else:
            assert session.state is expected
    core.release(session)
    assert core.sessions == set() and core.pending == 0 and not core.per_address


def test_every_state_has_a_way_out() -> None:
    for state in ClientState:
        if state not in (ClientState.CLOSED, ClientState.FAILED):
            assert any(s is state for s, _ in CLIENT_TRANSITIONS), state
    for state in SessionState:
        assert any(s is state for s, _ in SESSION_TRANSITIONS), state


def test_calls_out_of_order_are_local_protocol_errors() -> None:
    client = ClientHandshake(lambda key: None)
    with pytest.raises(LocalProtocolError, match="not allowed in state 'idle'"):
        client.done()
    assert client.state is ClientState.FAILED


# ------------------------------------------------------------------ whole handshakes


def test_full_handshake_in_memory_then_sealed_messages_both_ways() -> None:
    core = _core()
    client, session = _handshake(core)
    assert client.state is ClientState.CONNECTED and session.state is SessionState.CONNECTED
    assert core.pending == 0 and core.counters.connected == 1
    c_seal, c_open = client.keys.client_sealer(SealCounters())
    s_seal, s_open = session.keys.server_sealer(SealCounters())
    assert s_open.open(c_seal.seal(b"up")) == b"up"
    assert c_open.open(s_seal.seal(b"down")) == b"down"
    d = session.details
    assert d.encryption and d.c2s_session_id != d.s2c_session_id
    for sid in (d.c2s_session_id, d.s2c_session_id):
        assert not -1 <= sid <= 1000


def test_welcome_for_another_connect_key_is_ignored() -> None:
    core = _core()
    a, b = _client(), _client()
    session_a = _admit(core, "10.0.0.1", a, 0)
    b.hello()
    assert b.on_reply(session_a.welcome) is None and b.ignored_replies == 1
    assert b.state is ClientState.HELLO_SENT
    assert a.on_reply(session_a.welcome) is not None


def test_spoofed_hello_reusing_a_clients_connect_key_cannot_hijack_it() -> None:
    core = _core()
    victim = _client()
    victim.hello()
    spoofer = ClientHandshake(lambda key: None)
    spoofer.connect_key = victim.connect_key
    spoofer.start(0)
    spoofed = _admit(core, "10.9.9.9", spoofer, 0)
    # The server refuses the victim's own HELLO (connect key in use) but the victim ignores a
    # WELCOME sealed for somebody else and keeps waiting; the spoofer's pending session expires.
    assert victim.on_reply(spoofed.welcome) is None
    with pytest.raises(Rejected) as info:
        _admit(core, "10.0.0.1", victim, 0)
    assert info.value.code.name == "MALFORMED"
    assert [s.address for s in core.expired(11 * S)] == ["10.9.9.9"]
    core.release(spoofed)
    hello = victim._hello  # the same HELLO with its cookie, still valid 12 s later
    assert core.on_hello("10.0.0.1", hello, 12 * S, source="10.0.0.1:4000")


def test_refusals_become_typed_exceptions() -> None:
    client = _client(endpoint="srv:1")
    client.hello()
    with pytest.raises(ServerFullError, match="SERVER_FULL"):
        client.on_reply(m.Refuse(client.connect_key, 3, "full").encode())
    assert client.state is ClientState.FAILED
    assert isinstance(refusal(99, "x"), HandshakeError)


def test_changed_server_key_is_refused_before_connecting() -> None:
    core = _core()

    def refuse(key: bytes) -> None:
        raise KeyRefusedError("changed", "srv:1")

    client = ClientHandshake(refuse)
    client.start(0)
    # checked on the COOKIE (version 3), so the client's identity is never sealed for that key
    with pytest.raises(KeyRefusedError):
        _admit(core, "10.0.0.1", client, 0)
    assert client.state is ClientState.FAILED and client.retry_hello is None
    assert not core.sessions and core.counters.accepted == 0


def test_bad_done_closes_the_session_and_frees_it() -> None:
    core = _core()
    client = _client()
    session = _admit(core, "10.0.0.1", client, 0)
    with pytest.raises(RemoteProtocolError):
        core.on_done(session, m.Done(b"\0" * 16).encode())
    with pytest.raises(RemoteProtocolError):
        ServerSession.on_done(session, b"garbage")  # a closed session refuses everything
    core.release(session)
    assert core.counters.bad_done == 1 and core.pending == 0 and not core.session_ids


def test_bad_confirm_fails_the_client() -> None:
    core = _core()
    client = _client()
    session = _admit(core, "10.0.0.1", client, 0)
    client.on_reply(session.welcome)
    client.done()
    with pytest.raises(RemoteProtocolError, match="CONFIRM"):
        client.on_confirm(m.Confirm(b"\1" * 16).encode())
    assert client.state is ClientState.FAILED


def test_client_timeout_with_a_manual_clock() -> None:
    client = ClientHandshake(lambda key: None, timeout_ns=2 * S)
    client.start(10 * S)
    client.hello()
    client.check_timeout(11 * S)
    with pytest.raises(HandshakeTimeoutError, match="hello_sent"):
        client.check_timeout(12 * S)
    assert client.state is ClientState.FAILED


# ------------------------------------------------------------------ admission


def test_limits_per_address_total_and_pending() -> None:
    core = _core(max_per_address=2, max_clients=5, max_pending=4)
    for _ in range(2):
        _admit(core, "10.0.0.1", _client(), 0)
    with pytest.raises(Rejected) as info:
        _admit(core, "10.0.0.1", _client(), 0)
    assert isinstance(refusal(info.value.code, "x"), TooManyConnectionsError)
    _admit(core, "10.0.0.2", _client(), 0)
    _admit(core, "10.0.0.3", _client(), 0)
    with pytest.raises(Rejected) as info:
        _admit(core, "10.0.0.4", _client(), 0)
    assert isinstance(refusal(info.value.code, "x"), TooManyPendingError)
    # Connected sessions count against the total too.
    core2 = _core(max_clients=2)
    _handshake(core2, "10.0.0.1")
    _handshake(core2, "10.0.0.2")
    with pytest.raises(Rejected) as info:
        _admit(core2, "10.0.0.3", _client(), 0)
    assert isinstance(refusal(info.value.code, "x"), ServerFullError)
    assert core.counters.refused == {"TOO_MANY_FROM_ADDRESS": 1, "TOO_MANY_PENDING": 1}


def test_allow_and_deny_lists_with_cidr_ranges_v4_and_v6() -> None:
    core = _core(allow=("10.0.0.0/8", "fd00::/8"), deny=("10.6.6.0/24",))
    assert core.address_allowed("10.1.2.3") and core.address_allowed("fd00::5")
    assert not core.address_allowed("10.6.6.6") and not core.address_allowed("192.168.1.1")
    with pytest.raises(Rejected) as info:
        _admit(core, "10.6.6.6", _client(), 0)
    assert isinstance(refusal(info.value.code, "x"), AddressDeniedError)
    assert not core.sessions and not core.per_address


def test_unsupported_version_and_malformed_hello() -> None:
    core = _core()
    hello = m.Hello(1, 5, bytes(range(32)), True).encode()  # version 1 had no cookie
    with pytest.raises(Rejected) as info:
        core.on_hello("10.0.0.1", hello, 0)
    assert isinstance(refusal(info.value.code, "x"), UnsupportedVersionError)
    with pytest.raises(Rejected) as info:
        core.on_hello("10.0.0.1", b"\x93garbage", 0)
    assert info.value.reply is None  # nobody to address: silent, but counted
    assert core.counters.malformed == 1


def test_pending_sessions_expire_and_free_everything() -> None:
    core = _core(handshake_timeout_ns=5 * S)
    sessions = [_admit(core, f"10.0.0.{i}", _client(), i * S) for i in range(4)]
    assert core.next_deadline_ns() == 5 * S
    expired = core.expired(6 * S)
    assert set(expired) == {sessions[0], sessions[1]}  # deadlines 5 s and 6 s
    for session in expired:
        core.release(session, SessionEvent.TIMEOUT)
    assert core.pending == 2
    for session in core.expired(100 * S):
        core.release(session, SessionEvent.TIMEOUT)
    assert core.pending == 0 and not core.sessions and not core.session_ids
    assert not core.stream_ids and not core.connect_keys and not core.per_address
    assert core.counters.expired == 4


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["done", "expire", "close"])), max_size=30
    )
)
def test_no_leak_whatever_order_sessions_end_in(plan) -> None:
    core = _core(max_per_address=100)
    live: list[tuple[ClientHandshake, ServerSession]] = []
    for now, (address, how) in enumerate(plan):
        client = _client()
        live.append((client, _admit(core, f"10.0.0.{address}", client, now * S)))
        client, session = live[0]
        if how == "done" and session.state is SessionState.WELCOMED:
            client.on_reply(session.welcome)
            core.on_done(session, client.done())
        elif how == "expire":
            for s in core.expired((now + 20) * S):
                core.release(s, SessionEvent.TIMEOUT)
            live = [(c, s) for c, s in live if not s.released]
        else:
            core.release(session)
            live.pop(0)
    for _, session in live:
        core.release(session)
    assert core.pending == 0 and not core.sessions and not core.session_ids
    assert not core.stream_ids and not core.connect_keys and not core.per_address


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "server.example"])
def test_sessions_off_loopback_use_datagrams_that_fit_a_1500_byte_path_unfragmented(host) -> None:
    # Issue 15: 8 KiB datagrams were IP-fragmented on a 1,500-byte link, so 5% packet loss was
    # ~26% datagram loss. A datagram must fit 1500 - 20 (IPv4) - 8 (UDP) bytes (1452 on IPv6).
    from aeron_spark.connector.session.link import session_mtu

    assert ServerConfig(host=host).mtu <= 1452
    assert session_mtu(host) <= 1452
    assert ServerConfig(host="127.0.0.1").mtu == 65504  # loopback keeps the largest


# ------------------------------------------------------------------ issue 19: ids from one read


def test_a_session_takes_its_four_ids_from_one_read_of_the_random_source() -> None:
    reads: list[int] = []

    def counted(n: int) -> bytes:
        reads.append(n)
        return os.urandom(n)

    core = ServerCore(ServerConfig(), X25519PrivateKey.generate(), random_bytes=counted)
    sessions = [_handshake(core, f"10.0.{i}.1")[1] for i in range(20)]
    assert len(reads) == 20 and set(reads) == {16}
    ids = [(s.details.c2s_session_id, s.details.s2c_session_id) for s in sessions]
    streams = [(s.details.c2s_stream_id, s.details.s2c_stream_id) for s in sessions]
    assert len({i for pair in ids for i in pair}) == 40
    assert len({i for pair in streams for i in pair}) == 40
    assert all(not RESERVED_SESSION_ID_LOW <= i <= RESERVED_SESSION_ID_HIGH for p in ids for i in p)
    assert all(MIN_SESSION_STREAM_ID <= i < 2**31 for pair in streams for i in pair)


def test_reserved_in_use_and_out_of_range_ids_are_drawn_again() -> None:
    """A source that offers every id a session must not take first: reserved session ids (0,
    -1, 1000), the in-use one, stream ids below the minimum, the handshake's own stream ids."""

    def word(value: int) -> bytes:
        return (value % 2**32).to_bytes(4, "little")

    session = [0 + 2**31, -1 + 2**31, 1000 + 2**31, 5000 + 2**31]  # -> 5000 after 3 rejections
    stream = [5, 0x48534B01, 0x48534B02 | 2**31, 0x20000]  # top bit is ignored: -> 0x20000
    again = [5000 + 2**31, 6000 + 2**31]  # 5000 is in use now: -> 6000
    stream2 = [0x20000, MIN_SESSION_STREAM_ID - 1, 0x30000]
    feed = b"".join(word(v) for v in session + stream + again + stream2)
    feed += bytes(16 - len(feed) % 16) if len(feed) % 16 else b""

    def source(n: int) -> bytes:
        nonlocal feed
        chunk, feed = feed[:n], feed[n:]
        assert len(chunk) == n, "drew more than the test offered"
        return chunk

    core = ServerCore(ServerConfig(), X25519PrivateKey.generate(), random_bytes=source)
    _, s = _handshake(core)
    d = s.details
    assert (d.c2s_session_id, d.c2s_stream_id) == (5000, 0x20000)
    assert (d.s2c_session_id, d.s2c_stream_id) == (6000, 0x30000)
    core.release(s)
    assert not core.session_ids and not core.stream_ids

"""An on-path attacker flips bits in each field of HELLO and WELCOME (issue 22).

The real codec and both sans-I/O machines, with a manual clock: every HELLO the client sends
(and every WELCOME the server sends) passes through the attacker, who flips the lowest bit of one
field's value (or of one key's name) in the msgpack bytes. Each tampering must make the handshake
fail with the error it should (a coded refusal, or HANDSHAKE_TIMEOUT where the client cannot tell
a tampered reply from another client's and ignores it) and must be counted where it was noticed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import pytest
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.errors import (
    ErrorCode,
    HandshakeError,
    HandshakeTimeoutError,
    RemoteProtocolError,
    UnsupportedVersionError,
)
from aeron_spark.handshake.machine import (
    ClientHandshake,
    ClientState,
    Rejected,
    ServerCore,
    ServerSession,
    SessionState,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

S = 1_000_000_000
ADDRESS, SOURCE = "10.0.0.1", "10.0.0.1:4000"


def _spans(data: bytes) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """For a msgpack map: key -> ((start, end) of the key's bytes, (start, end) of its value's)."""
    assert 0x80 <= data[0] <= 0x8F, "handshake messages are small maps"
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data[1:])
    out, at = {}, 1
    for _ in range(data[0] & 0x0F):
        key = unpacker.unpack()
        key_span = (at, 1 + unpacker.tell())
        at = 1 + unpacker.tell()
        unpacker.skip()
        out[key] = (key_span, (at, 1 + unpacker.tell()))
        at = 1 + unpacker.tell()
    return out


def flip(field: str, *, name: bool = False) -> Callable[[bytes], bytes]:
    """Flip the lowest bit of the last byte of ``field``'s value (or of its key's name)."""

    def tamper(data: bytes) -> bytes:
        spans = _spans(data)
        if field not in spans:
            return data  # e.g. the first HELLO has no cookie yet
        key_span, value_span = spans[field]
        end = (key_span if name else value_span)[1]
        out = bytearray(data)
        out[end - 1] ^= 0x01
        return bytes(out)

    return tamper


@dataclass
class Outcome:
    error: HandshakeError | None
    client: ClientHandshake
    core: ServerCore
    sessions: list[ServerSession]
    hellos_seen: int


def run(
    on_hello: Callable[[bytes], bytes] = lambda d: d,
    on_welcome: Callable[[bytes], bytes] = lambda d: d,
) -> Outcome:
    """One handshake through the attacker; at the end both sides' timeouts have run."""
    core = ServerCore(ServerConfig(), X25519PrivateKey.generate())
    pinned = core.static_public

    def check(key: bytes) -> None:
        assert key == pinned

    client = ClientHandshake(check, encryption=True, timeout_ns=10 * S)
    client.start(0)
    send: bytes | None = client.hello()
    sessions: list[ServerSession] = []
    hellos = 0
    error: HandshakeError | None = None
    try:
        while send is not None and hellos < 10:
            hellos += 1
            try:
                session = core.on_hello(ADDRESS, on_hello(send), 0, source=SOURCE)
            except Rejected as answer:
                if answer.reply is None:
                    break  # dropped silently
                reply = answer.reply
            else:
                sessions.append(session)
                reply = on_welcome(session.welcome)
            details = client.on_reply(reply)
            if details is not None:
                confirm = core.on_done(sessions[-1], client.done())
                client.on_confirm(confirm)
                break
            send, client.retry_hello = client.retry_hello, None
        client.check_timeout(10 * S)
    except HandshakeError as exc:
        error = exc
    for session in core.expired(11 * S):
        core.release(session)
    return Outcome(error, client, core, sessions, hellos)


def test_without_tampering_the_handshake_completes() -> None:
    out = run()
    assert out.error is None and out.client.state is ClientState.CONNECTED
    assert out.core.counters.connected == 1 and out.client.ignored_replies == 0
    assert out.core.counters.cookies_sent == 1 and out.core.counters.cookies_bad == 0


def _assert_nothing_held(core: ServerCore) -> None:
    assert core.pending == 0 and not core.per_address and not core.pending_per_prefix
    assert core.counters.connected == 0
    assert all(s.state is SessionState.CLOSED for s in core.sessions)


def _timed_out(out: Outcome) -> None:
    assert isinstance(out.error, HandshakeTimeoutError), out.error
    assert out.error.code is ErrorCode.HANDSHAKE_TIMEOUT
    assert out.client.state is ClientState.FAILED


# ------------------------------------------------------------------ HELLO


@pytest.mark.parametrize("tamper", [flip("t"), flip("enc", name=True)], ids=["t", "key-name"])
def test_hello_type_or_key_name_is_malformed_and_dropped(tamper) -> None:
    out = run(on_hello=tamper)
    _timed_out(out)
    c = out.core.counters
    assert c.malformed == 1 and c.refused == {"MALFORMED": 1}
    assert c.accepted == 0 and c.cookies_sent == 0 and out.sessions == []
    _assert_nothing_held(out.core)


def test_hello_version_is_refused_with_unsupported_version() -> None:
    out = run(on_hello=flip("v"))
    assert isinstance(out.error, UnsupportedVersionError), out.error
    assert out.error.code is ErrorCode.UNSUPPORTED_VERSION
    assert "protocol version 3" in str(out.error)
    assert out.core.counters.refused == {"UNSUPPORTED_VERSION": 1}
    assert out.sessions == [] and out.client.state is ClientState.FAILED
    _assert_nothing_held(out.core)


def test_hello_connect_key_gets_a_cookie_the_client_does_not_take() -> None:
    out = run(on_hello=flip("ck"))
    _timed_out(out)
    # The COOKIE went to a connect key that is not the client's: it ignored it.
    assert out.core.counters.cookies_sent == 1 and out.client.ignored_replies == 1
    assert out.client.cookies == 0 and out.sessions == []
    _assert_nothing_held(out.core)


@pytest.mark.parametrize("field", ["pk", "enc"])
def test_hello_key_or_encryption_flag_gives_a_welcome_the_client_cannot_open(field) -> None:
    """The server admits the tampered HELLO (its cookie was made for the tampered values) but
    the transcript covers the HELLO the client sent, so the WELCOME does not authenticate:
    ignored and counted by the client, and the server's pending session expires (no downgrade
    to a plain session, no session with another key)."""
    out = run(on_hello=flip(field))
    _timed_out(out)
    assert out.core.counters.accepted == 1 and len(out.sessions) == 1
    assert out.client.ignored_replies == 1 and out.client.keys is None
    assert out.core.counters.expired == 1 and out.sessions[0].released
    _assert_nothing_held(out.core)


def test_hello_cookie_is_refused_each_time_until_the_client_gives_up() -> None:
    out = run(on_hello=flip("cookie"))
    _timed_out(out)
    c = out.core.counters
    # 1 HELLO without a cookie, then MAX_COOKIES (3) with a tampered one, each bad and counted.
    assert out.hellos_seen == 4 and c.cookies_bad == 3 and c.cookies_sent == 4
    assert out.client.cookies == 3 and out.client.ignored_replies == 1
    assert c.accepted == 0 and out.sessions == []
    _assert_nothing_held(out.core)


# ------------------------------------------------------------------ WELCOME


@pytest.mark.parametrize(
    "tamper",
    [flip("t"), flip("ck"), flip("spk"), flip("epk"), flip("box"), flip("box", name=True)],
    ids=["t", "ck", "spk", "epk", "box", "key-name"],
)
def test_tampered_welcome_is_ignored_and_the_session_expires(tamper) -> None:
    out = run(on_welcome=tamper)
    _timed_out(out)
    assert out.client.ignored_replies == 1 and out.client.keys is None
    assert out.core.counters.accepted == 1 and out.core.counters.expired == 1
    assert out.sessions[0].released
    _assert_nothing_held(out.core)


# ------------------------------------------------------------------ DONE and CONFIRM


def _to_done(out_core: ServerCore) -> tuple[ClientHandshake, ServerSession]:
    client = ClientHandshake(lambda key: None, encryption=True)
    client.start(0)
    try:
        out_core.on_hello(ADDRESS, client.hello(), 0, source=SOURCE)
    except Rejected as answer:
        client.on_reply(answer.reply)
    session = out_core.on_hello(ADDRESS, client.retry_hello, 0, source=SOURCE)
    assert client.on_reply(session.welcome) is not None
    return client, session


def test_tampered_done_proof_is_refused_and_counted() -> None:
    core = ServerCore(ServerConfig(), X25519PrivateKey.generate())
    client, session = _to_done(core)
    with pytest.raises(RemoteProtocolError, match="DONE's proof"):
        core.on_done(session, flip("proof")(client.done()))
    assert core.counters.bad_done == 1 and core.counters.connected == 0
    assert session.state is SessionState.CLOSED
    core.release(session)
    _assert_nothing_held(core)


def test_tampered_confirm_proof_fails_the_client() -> None:
    core = ServerCore(ServerConfig(), X25519PrivateKey.generate())
    client, session = _to_done(core)
    confirm = core.on_done(session, client.done())
    with pytest.raises(RemoteProtocolError, match="CONFIRM's proof"):
        client.on_confirm(flip("proof")(confirm))
    assert client.state is ClientState.FAILED

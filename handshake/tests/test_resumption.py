"""Issue 19, the handshake rate: a client process keeps one HELLO channel per server for all its
handshakes (no sockets, images or set-up round trip per connect), and a WELCOME's sealed
resumption token lets the next HELLO from the same source skip the COOKIE round trip
(protocol version 4). In memory first (the tokens), then over real UDP sockets (the channel)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.handshake import Client, ClientConfig, KeyRefusedError
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.hello_channel import HelloChannel, registry
from aeron_spark.handshake.machine import ClientHandshake, Rejected, ServerCore

from .conftest import wait_for

S = 1_000_000_000
ADDRESS, SOURCE = "10.0.0.1", "10.0.0.1:4000"
CLIENT_KEY = X25519PrivateKey.generate()  # the client's identity, the same in every handshake


def _core() -> ServerCore:
    return ServerCore(ServerConfig(), X25519PrivateKey.generate())


def _first_handshake(core: ServerCore, now: int = 0) -> tuple[bytes, list[bytes]]:
    """A whole handshake with a COOKIE round: the client's resumption token and every message
    the server sent in the clear or sealed (to look for the token in)."""
    client = ClientHandshake(lambda key: None, static_key=CLIENT_KEY)
    client.start(now)
    with pytest.raises(Rejected) as cookie:
        core.on_hello(ADDRESS, client.hello(), now, source=SOURCE)
    assert cookie.value.reply is not None
    client.on_reply(cookie.value.reply)
    assert client.retry_hello is not None
    session = core.on_hello(ADDRESS, client.retry_hello, now, source=SOURCE)
    details = client.on_reply(session.welcome)
    assert details is not None and len(details.resume_token) == m.COOKIE_LENGTH
    confirm = core.on_done(session, client.done())
    client.on_confirm(confirm)
    return details.resume_token, [cookie.value.reply, session.welcome, confirm]


def _resumed_client(
    token: bytes, server_key: bytes, now: int = 0, key: X25519PrivateKey = CLIENT_KEY
) -> tuple[ClientHandshake, bytes]:
    client = ClientHandshake(lambda key: None, static_key=key)
    client.start(now)
    return client, client.hello((token, server_key))


def test_a_welcome_token_admits_the_next_hello_from_its_source_without_a_cookie() -> None:
    core = _core()
    token, sent = _first_handshake(core)
    assert all(token not in message for message in sent)  # only ever sealed
    assert core.counters.cookies_sent == 1
    client, hello = _resumed_client(token, core.static_public, 5 * S)
    session = core.on_hello(ADDRESS, hello, 5 * S, source=SOURCE)  # no COOKIE round trip
    assert core.counters.resumed == 1 and core.counters.cookies_sent == 1
    details = client.on_reply(session.welcome)
    assert details is not None and details == session.details
    client.on_confirm(core.on_done(session, client.done()))
    assert core.counters.connected == 2


@pytest.mark.parametrize(
    ("address", "source", "now"),
    [
        (ADDRESS, "10.0.0.1:4001", 0),  # another port
        ("10.0.0.2", "10.0.0.2:4000", 0),  # another address
        (ADDRESS, SOURCE, 25 * S),  # past its 10-20 s
    ],
    ids=["other-port", "other-address", "stale"],
)
def test_a_token_elsewhere_or_stale_gets_a_cookie_and_the_client_goes_on(
    address: str, source: str, now: int
) -> None:
    core = _core()
    token, _ = _first_handshake(core)
    client, hello = _resumed_client(token, core.static_public, now)
    with pytest.raises(Rejected) as answer:
        core.on_hello(address, hello, now, source=source)
    assert answer.value.code is None and answer.value.reply is not None  # a COOKIE
    assert core.counters.cookies_bad == 1 and core.counters.resumed == 0
    assert core.pending == 0  # nothing allocated
    client.on_reply(answer.value.reply)
    assert client.retry_hello is not None
    session = core.on_hello(address, client.retry_hello, now, source=source)
    assert client.on_reply(session.welcome) == session.details


def test_a_token_admits_one_hello_only() -> None:
    # Issue 28 item 8: a token sniffed (it travels in the clear in the HELLO that uses it)
    # and replayed from its source got pending sessions until it expired (40 in the review).
    core = _core()
    token, _ = _first_handshake(core)
    client, hello = _resumed_client(token, core.static_public, 1 * S)
    first = core.on_hello(ADDRESS, hello, 1 * S, source=SOURCE)
    core.release(first)  # the connect key is free again: only the token can refuse now
    for replayed in (hello, _resumed_client(token, core.static_public, 2 * S)[1]):
        with pytest.raises(Rejected) as answer:
            core.on_hello(ADDRESS, replayed, 2 * S, source=SOURCE)
        assert answer.value.code is None  # a COOKIE: nothing allocated
    assert core.counters.resumed == 1 and core.pending == 0
    assert core.counters.accepted == 2  # the first handshake and the one resumption


def test_a_token_admits_only_the_client_key_it_was_issued_to() -> None:
    # Issue 28 item 8: the token was bound to ip:port only, so another key could use it.
    core = _core()
    token, _ = _first_handshake(core)
    other = X25519PrivateKey.generate()
    _, hello = _resumed_client(token, core.static_public, 1 * S, key=other)
    with pytest.raises(Rejected) as answer:
        core.on_hello(ADDRESS, hello, 1 * S, source=SOURCE)
    assert answer.value.code is None and core.pending == 0
    assert core.counters.cookies_reused == 1 and core.counters.resumed == 0
    # its owner can still use it
    _, hello = _resumed_client(token, core.static_public, 2 * S)
    core.on_hello(ADDRESS, hello, 2 * S, source=SOURCE)
    assert core.counters.resumed == 1


def test_a_replayed_hello_with_a_cookie_allocates_nothing() -> None:
    # The second HELLO, recorded and replayed whole from its own source within the cookie's
    # 10-20 s (after its session ended, so that its connect key is free), gets a COOKIE.
    core = _core()
    client = ClientHandshake(lambda key: None, static_key=CLIENT_KEY)
    client.start(0)
    with pytest.raises(Rejected) as cookie:
        core.on_hello(ADDRESS, client.hello(), 0, source=SOURCE)
    client.on_reply(cookie.value.reply or b"")
    assert client.retry_hello is not None
    core.release(core.on_hello(ADDRESS, client.retry_hello, 0, source=SOURCE))
    with pytest.raises(Rejected) as again:
        core.on_hello(ADDRESS, client.retry_hello, 1 * S, source=SOURCE)
    assert again.value.code is None and core.pending == 0
    assert core.counters.cookies_reused == 1 and core.counters.accepted == 1


def test_a_token_of_a_server_whose_key_changed_has_the_new_key_checked() -> None:
    old = _core()
    token, _ = _first_handshake(old)
    new = _core()  # same address, a new key (and a new cookie secret)
    checked: list[bytes] = []

    def check(key: bytes) -> None:
        checked.append(key)
        if key != old.static_public:
            raise KeyRefusedError("the server's key changed", "10.0.0.9:1")

    client = ClientHandshake(check)
    client.start(0)
    hello = client.hello((token, old.static_public))
    with pytest.raises(Rejected) as answer:
        new.on_hello(ADDRESS, hello, 0, source=SOURCE)
    with pytest.raises(KeyRefusedError):
        client.on_reply(answer.value.reply or b"")
    assert checked == [old.static_public, new.static_public]


# ------------------------------------------------------------------ over UDP


def _channels_of(client: Client) -> list[HelloChannel]:
    return [c for c in registry.channels.values() if c.driver is client.driver]


def test_sequential_connects_share_one_hello_channel_and_skip_the_cookie(
    make_server, make_client
) -> None:
    server = make_server()
    client = make_client()
    for i in range(5):
        with client.connect(server.endpoint) as conn:
            conn.send(bytes([i]) * 10)
            assert conn.receive(30.0) == bytes([i]) * 10
    stats = server.stats()
    assert stats["connected"] == 5
    assert stats["cookies_sent"] == 1 and stats["resumed"] == 4
    assert stats["hello_images"] == 1  # one HELLO publication carried all five
    assert len(_channels_of(client)) == 1


def test_concurrent_connects_on_one_channel_each_get_their_own_session(
    make_server, make_client
) -> None:
    server = make_server()
    client = make_client()
    with ThreadPoolExecutor(8) as pool:
        conns = list(pool.map(lambda i: client.connect(server.endpoint), range(16)))
    try:
        for i, conn in enumerate(conns):
            conn.send(b"n%d" % i)
        for i, conn in enumerate(conns):
            assert conn.receive(30.0) == b"n%d" % i
        assert server.stats()["connected"] == 16 and server.stats()["hello_images"] == 1
    finally:
        for conn in conns:
            conn.close()


def test_hello_linger_zero_gives_every_handshake_its_own_channel(make_server, make_client) -> None:
    server = make_server()
    client = make_client(hello_linger_s=0)
    for _ in range(3):
        client.connect(server.endpoint).close()
    stats = server.stats()
    assert stats["connected"] == 3 and stats["cookies_sent"] == 3 and stats["resumed"] == 0
    assert _channels_of(client) == []
    wait_for(lambda: server.stats()["hello_images"] == 0, what="the HELLO images to end")


def test_an_idle_channel_closes_after_its_linger(make_server, make_client) -> None:
    server = make_server()
    client = make_client(hello_linger_s=0.3)
    client.connect(server.endpoint).close()
    (channel,) = _channels_of(client)
    wait_for(lambda: channel.closed, timeout_s=30.0, what="the reaper to close the idle channel")
    assert _channels_of(client) == []
    wait_for(lambda: server.stats()["hello_images"] == 0, what="the server to see it end")


def test_a_server_closed_and_started_again_on_its_ports_gets_a_fresh_channel(
    make_server, make_client
) -> None:
    first = make_server()
    client = make_client()
    client.connect(first.endpoint).close()
    (old,) = _channels_of(client)
    port = first.port
    first.close()
    second = make_server(port=port)  # the same key store: the same server key
    with client.connect(second.endpoint) as conn:
        conn.send(b"again")
        assert conn.receive(30.0) == b"again"
    assert old.closed and old not in _channels_of(client)
    assert second.stats()["connected"] == 1


_SERVER = textwrap.dedent(
    """
    import sys
    from aeron_spark.handshake import Server, ServerConfig
    server = Server(
        ServerConfig(key_store_dir=sys.argv[1], port=int(sys.argv[2])),
        on_message=lambda c, m: c.send(m),
    ).start()
    print(server.port, flush=True)
    sys.stdin.readline()
    """
)


def _serve(key_dir: str, port: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, key_dir, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"server did not start: {line!r}"
    return proc, int(line)


def test_a_server_killed_and_restarted_is_not_reached_over_its_dead_channel(
    tmp_path, make_client
) -> None:
    """kill -9: no end-of-stream reaches the client. Its channel's reply image goes silent (the
    server heartbeats every 100 ms): once silent past ``STALE_NS`` the next handshake opens a
    fresh channel instead of saying HELLO into the dead one."""
    key_dir = str(tmp_path / "server")
    proc, port = _serve(key_dir, 0)
    client = make_client()
    try:
        client.connect(f"127.0.0.1:{port}").close()
        (old,) = _channels_of(client)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: old.is_stale(time.monotonic_ns()), what="the dead channel to go stale")
        proc, _ = _serve(key_dir, port)
        with client.connect(f"127.0.0.1:{port}") as conn:
            conn.send(b"after kill -9")
            assert conn.receive(30.0) == b"after kill -9"
        assert old.closed
    finally:
        proc.kill()
        proc.wait(10)


def test_a_client_config_bounds_hello_linger() -> None:
    from aeron_spark.errors import ConfigurationError

    for bad in (-1, 3601):
        with pytest.raises(ConfigurationError, match="hello_linger_s"):
            ClientConfig(hello_linger_s=bad)

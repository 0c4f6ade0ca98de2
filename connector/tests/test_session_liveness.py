"""A session's lease is renewed while its transport shows the client alive (issue 31 item 1).

An idle client sends no request (its keepalives go only while it waits for a reply), but its
driver keeps sending status messages for the server's reply publication and heartbeats on its
own publication, about once a second. Before, a session idle for the lease (60 s) was expired
however alive its client was: 2,048 sessions opened one by one took over a minute, so the
first ones were expired, reconnected, expired again (8,152 expiries). Now a lease that runs
out is renewed from the transport's last sign of the client; a session expires when its
transport has been silent for the lease (a process killed, a host cut off, a process stopped).

Real sockets, a real server (in this process: its counters are read directly) and, where a
client must die or freeze, a client in a process of its own.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import client_process

STREAM = 10


def _server(tmp_path: Path, lease_s: float, **kw: object) -> StreamServer:
    config = ServerConfig(
        directory=str(tmp_path / "srv"),
        port=0,
        encryption=False,
        term_length=1 << 20,
        session_lease_ns=int(lease_s * 1e9),
        **kw,  # type: ignore[arg-type]
    )
    return StreamServer(config).start()


def _endpoint(server: StreamServer, media: str) -> str:
    if media == "ipc":
        return f"ipc:{server.endpoint.rpartition(':')[2]}"
    return server.endpoint


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def _counter(server: StreamServer, name: str) -> int:
    assert server.core is not None
    return int(server.core.counters[name])


@pytest.mark.parametrize("media", ["udp", "ipc"])
def test_an_idle_client_outlives_a_short_lease_while_its_transport_is_alive(
    tmp_path: Path, media: str
) -> None:
    """Fails on the old code: the idle session was expired after the lease (3 s), and the
    next request went out on a new session (``reconnects`` 1)."""
    lease_s = 3.0
    with _server(tmp_path, lease_s) as server:
        settings = ClientSettings(endpoint=_endpoint(server, media), encryption=False)
        with StreamClient.connect(settings) as client:
            client.publish(STREAM, [b"before"])
            assert server.core is not None
            (session,) = server.core.sessions.values()
            # idle: no request, no keepalive (they go only while a reply is awaited)
            _wait_for(
                lambda: (
                    time.monotonic_ns() - session.opened_ns > 3 * lease_s * 1e9
                    or _counter(server, "sessions_expired") > 0
                ),
                "three leases idle",
            )
            assert _counter(server, "sessions_expired") == 0
            assert _counter(server, "session_leases_renewed_by_transport") >= 2
            assert client.publish(STREAM, [b"after"]) > 0  # on its first session
            assert client.reconnects == 0
            assert list(server.core.sessions.values()) == [session]


@pytest.mark.parametrize("media", ["udp", "ipc"])
def test_the_sessions_of_a_client_killed_with_sigkill_are_closed_after_the_lease(
    tmp_path: Path, media: str
) -> None:
    """A killed client's transport goes silent: each of its sessions is gone within the lease
    plus the transport's idle cadence (UDP: expired by its lease, 2 s, before the reply
    publication's 5 s connection timeout; IPC: its subscriber's process is seen dead, so its
    lease is not renewed, and its image goes at once), none renewed afterwards."""
    lease_s = 2.0
    with _server(tmp_path, lease_s) as server:
        assert server.core is not None
        with client_process(_endpoint(server, media), 4, STREAM) as client:
            assert len(server.core.sessions) == 4
            opened = _counter(server, "sessions_opened")
            client.proc.kill()
            client.proc.wait(30)
            killed = time.monotonic()
            _wait_for(lambda: not server.core.sessions, "the killed client's sessions closed")
            took = time.monotonic() - killed
            # the loop thread removes a session, then counts it: read both once it is done
            # (load 20: 3 of 4 counted when the last one had just been removed)
            _wait_for(
                lambda: (
                    _counter(server, "sessions_closed") >= 4
                    and (media == "ipc" or _counter(server, "sessions_expired") >= 4)
                ),
                "four closes counted",
                timeout_s=15.0,
            )
        assert _counter(server, "sessions_closed") == 4
        assert _counter(server, "sessions_opened") == opened  # nobody came back
        if media == "udp":  # a silent transport: the lease ran out (counted)
            assert _counter(server, "sessions_expired") == 4, f"closed after {took:.1f} s"


def test_a_client_holding_its_sessions_alive_cannot_pass_the_address_limit(
    tmp_path: Path,
) -> None:
    """Sessions kept by their transport count against the limits as any other: a client
    alive past several leases holds its two sessions from one address, and a third is refused
    (``TOO_MANY_FROM_ADDRESS``). The per-key limit counts open sessions the same way
    (``test_attack_sessions_per_key.py``)."""
    lease_s = 2.5  # the transport's signs come a second apart: room for a loaded machine
    with _server(tmp_path, lease_s, max_per_address=2) as server:
        settings = ClientSettings(endpoint=server.endpoint, encryption=False, timeout_s=10)
        with StreamClient.connect(settings) as one, StreamClient.connect(settings) as two:
            one.publish(STREAM, [b"x"])
            _wait_for(
                lambda: _counter(server, "session_leases_renewed_by_transport") >= 4,
                "both leases renewed twice",
            )
            with pytest.raises(ServerUnavailableError, match="TOO_MANY_FROM_ADDRESS"):
                StreamClient.connect(settings)
            assert two.list_streams() and one.publish(STREAM, [b"y"]) > 0
            assert one.reconnects == two.reconnects == 0
            assert _counter(server, "sessions_expired") == 0

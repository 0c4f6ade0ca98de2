"""Handshakes and sessions over real UDP sockets on IPv6 loopback (issue 28 item 12): a server on
``::1`` and on ``::``, a client on ``::1``, and the allow/deny lists applied to IPv6 peers."""

from __future__ import annotations

import socket

import pytest

from aeron_spark.handshake.errors import AddressDeniedError

from .conftest import wait_for


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    not _ipv6_loopback(), reason="this host has no IPv6 loopback (::1 cannot be bound)"
)


@pytest.mark.parametrize("server_host", ["::1", "::"])
def test_client_on_ipv6_loopback_connects_and_echoes(make_server, make_client, server_host) -> None:
    server = make_server(host=server_host)
    port = server.endpoint.rpartition(":")[2]
    conn = make_client().connect(f"[::1]:{port}")
    assert conn.is_connected
    conn.send(b"over ipv6")
    assert conn.receive(30.0) == b"over ipv6"
    big = b"v6" * 50_000  # fragmented
    conn.send(big)
    assert conn.receive(30.0) == big
    conn.close()
    wait_for(lambda: server.stats()["connections"] == 0, what="the server to reap the session")
    assert server.stats()["connected"] == 1


def test_ipv6_allow_list_admits_listed_and_refuses_others(make_server, make_client) -> None:
    allowed = make_server(host="::1", allow=("::1/128",), key_dir="k1")
    port = allowed.endpoint.rpartition(":")[2]
    conn = make_client().connect(f"[::1]:{port}")
    assert conn.is_connected
    conn.close()
    elsewhere = make_server(host="::1", allow=("2001:db8::/32",), key_dir="k2")
    port = elsewhere.endpoint.rpartition(":")[2]
    with pytest.raises(AddressDeniedError):
        make_client(timeout_s=5.0).connect(f"[::1]:{port}")
    assert elsewhere.stats()["connected"] == 0


def test_ipv6_deny_list_refuses_the_denied_prefix(make_server, make_client) -> None:
    server = make_server(host="::1", deny=("::1/128",))
    port = server.endpoint.rpartition(":")[2]
    with pytest.raises(AddressDeniedError):
        make_client(timeout_s=5.0).connect(f"[::1]:{port}")
    assert server.stats()["connected"] == 0

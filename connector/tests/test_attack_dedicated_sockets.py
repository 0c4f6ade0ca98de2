"""Attacks on the dedicated sockets (``SO_REUSEPORT``) of a real server process.

The server's public sockets are bound with ``SO_REUSEPORT`` so that connected sockets of its own
can share their port. Before this test, any other process of the same user could bind the same
address and port with ``SO_REUSEPORT`` too (the kernel allows it: same effective uid), join the
public socket's group and receive a hash-chosen share of the datagrams meant for the server: its
clients' HELLOs vanished into the intruder's socket and their handshakes timed out (1 of 6 in a
row measured, 99 datagrams stolen). Now the public socket's group carries a classic BPF program
that picks the group's first socket (the server's public one) for every datagram not claimed by
a connected socket, so a socket that joins later receives nothing and every handshake completes.
"""

from __future__ import annotations

import socket

import pytest

from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.handshake import client as handshake_client

TIMEOUT_S = 20.0  # the clients' timeout: a stolen HELLO shows as a handshake that times out
CLIENTS = 8  # client processes (a driver each), one after the other


def _received(sock: socket.socket) -> int:
    """Datagrams waiting on ``sock`` (drained)."""
    count = 0
    while True:
        try:
            sock.recv(65536)
        except BlockingIOError:
            return count
        count += 1


@pytest.mark.slow
def test_a_same_user_socket_on_the_servers_port_steals_no_datagram(tmp_path) -> None:
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        host, port_text = endpoint.rsplit(":", 1)
        intruders = []
        try:
            for port in (int(port_text), int(port_text) + 1):
                intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                intruders.append(intruder)
                intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                intruder.bind((host, port))  # the kernel lets the same user join the group
                intruder.setblocking(False)
            failures = []
            for _ in range(CLIENTS):
                # a driver of its own each: a client process of its own (its own source port)
                handshake_client._shared = None
                try:
                    with client_for(endpoint, timeout_s=TIMEOUT_S) as client:
                        client.stats()
                except Exception as exc:  # the stolen HELLO's handshake: reported below
                    failures.append(exc)
                finally:
                    driver = handshake_client._shared
                    handshake_client._shared = None
                    if driver is not None:
                        driver.close()
            stolen = [_received(s) for s in intruders]
        finally:
            for intruder in intruders:
                intruder.close()
    assert stolen == [0, 0], f"the intruder's sockets received {stolen} datagrams"
    assert failures == []

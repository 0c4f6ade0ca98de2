"""A failing host against the GSO batching of control frames (``UdpEndpoint.queue``/``flush``,
issue 31): a step's frames to one destination leave as one ``sendmsg``. When the kernel refuses
that send outright (a firewall's EPERM, EACCES, an unreachable network) every datagram of the
run is lost, as each would have been sent one by one: the counters must say so datagram by
datagram as :meth:`UdpEndpoint.send` counts, and the other destinations' runs of the same step
must still go, whole and in order. Real loopback sockets; the refused destination is the
limited broadcast address, which a socket without ``SO_BROADCAST`` may not send to (EACCES)."""

from __future__ import annotations

import select
import socket
import time

import pytest

from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.endpoint import UdpEndpoint, gso_supported
from aeron_spark.transport.uri import Endpoint

WAIT_S = 20.0
REFUSED = ("255.255.255.255", 9)  # EACCES: no SO_BROADCAST on the sender's socket


def _gso_here() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return gso_supported(s)


pytestmark = pytest.mark.skipif(not _gso_here(), reason="UDP GSO needs Linux 4.18 or later")


def _receive(sock: socket.socket, count: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"{len(got)} of {count} datagrams arrived"
        if select.select([sock], [], [], left)[0]:
            got.append(sock.recv(65536))
    return got


def test_attack_a_refused_run_counts_each_lost_datagram_and_spares_the_others() -> None:
    counters = SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.1", 0))
        good = peer.getsockname()
        assert udp.gso
        # the one-by-one path first: each refused datagram is a send error
        for _ in range(5):
            udp.send(bytes(36), REFUSED)
        assert counters.send_errors == 5 and counters.errors == 5
        counters.send_errors = counters.errors = 0
        # one step: frames to the refused destination and the good one, interleaved
        frames = [i.to_bytes(4, "little") + bytes(32) for i in range(20)]
        for frame in frames:
            udp.queue(frame, REFUSED)
            udp.queue(frame, good)
        udp.flush()
        assert _receive(peer, len(frames)) == frames  # the good run whole and in order
        assert counters.datagrams_sent == len(frames)
        assert counters.send_errors == len(frames), (
            f"{len(frames)} datagrams refused in one GSO send counted {counters.send_errors} "
            f"send error(s) (sent one by one: {len(frames)})"
        )
        assert counters.errors == len(frames)
    finally:
        udp.close()
        peer.close()

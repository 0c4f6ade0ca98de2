"""The test link itself (transport/testing_netns.py): loss settings across the whole range."""

from __future__ import annotations

import socket

import pytest

from aeron_spark.transport.testing_netns import LossyLink, unavailable_reason

reason = unavailable_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")


def _send_udp(link: LossyLink, count: int) -> None:
    """``count`` UDP datagrams from host ``a`` (this namespace) to host ``b``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for i in range(count):
            sock.sendto(i.to_bytes(4, "big"), (link.b.address, 9))


def test_loss_100_drops_every_packet_and_loss_0_none() -> None:
    """``set_loss(100)`` used to fail (``numgen random mod 10000 < 10000``: nft's value range is
    0..9999); 100 % is a cut link (a partition), every IP packet dropped and counted."""
    with LossyLink(loss_percent=0) as link:
        link.set_loss(100)
        _send_udp(link, 20)
        assert link.dropped(link.b)[0] == 20
        link.set_loss(0)
        _send_udp(link, 20)
        assert link.dropped(link.b)[0] == 0
        link.set_loss(99.99)  # the largest fraction the random rule still takes
        assert link.loss_percent == 99.99

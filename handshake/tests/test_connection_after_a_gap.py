"""A session's message made readable at once by a retransmission is read in one receive.

Issue 31: the stream server's loop reads a session once per signal (the subscription's
listener: data arrived) with ``receive_view_nowait()``, and a None meant "nothing left". A
message of more fragments than a poll takes (64; at a network mtu of 1408 that is ~88 KB) whose
second fragment was lost stays unreadable while the rest arrives; the retransmission makes it
all readable in one step, which signals once. The receive polled 64 fragments, completed no
message and said None, so the rest lay in the image with no signal to come: the server never
read the session again until something else arrived (a keepalive 10 s later; with the loop's
idle check skipping its read, over a lossy link, never: the client back-pressured for good,
``spark_tests/test_lossy_link.py``). Real UDP sockets on 127.0.0.1; the one datagram lost is
chosen by the test (``DropChosen``), not random.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from aeron_spark.handshake.connection import Connection
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.frames import DataFlags
from aeron_spark.transport.testing import DataHeader, DropChosen, free_udp_port

from .conftest import wait_for

STREAM = 1001
MTU = 1408  # a network session's (handshake.config.NETWORK_MTU): 1,376 bytes a fragment


def _middle_fragment(header: DataHeader) -> bool:
    """A fragment of the message neither its first (BEGIN) nor its last (END)."""
    return header.stream_id == STREAM and not header.flags & DataFlags.UNFRAGMENTED


@pytest.fixture
def lossy_driver() -> Iterator[tuple[Driver, DropChosen]]:
    # the message's second fragment, once (its retransmission passes)
    hook: DropChosen = DropChosen(lambda h: not hook.dropped and _middle_fragment(h))
    driver = Driver(DriverConfig(write_counters_file=False, loss=hook)).start()
    yield driver, hook
    driver.close()


def test_a_message_a_retransmission_completed_is_received_whole_by_the_read_it_signals(
    lossy_driver: tuple[Driver, DropChosen],
) -> None:
    driver, hook = lossy_driver
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|mtu={MTU}|term-length=1m"
    sub = driver.add_subscription(channel, STREAM)
    pub = driver.add_publication(channel, STREAM)
    conn = Connection(pub, sub, peer="loopback", max_message_length=128 * 1024)
    # the receiver calls the listener once a step, after inserting that step's datagrams: a
    # call made once the retransmission and the message's last fragment were handed on comes
    # with the whole message in the image (the read the stream server does on such a signal)
    whole: list[bool] = []

    def on_signal() -> None:  # on the receiver thread, as the hook
        ends = any(h.flags & DataFlags.END for h in hook.handed_headers)
        whole.append(bool(hook.resent) and ends)

    sub.add_listener(on_signal)
    try:
        wait_for(lambda: pub.is_connected, what="the publication to connect")
        message = os.urandom(100_000)  # 73 fragments: more than a poll's 64
        conn.send(message, timeout_s=30.0)
        wait_for(lambda: any(whole), what="the retransmission to complete the message")
        assert len(hook.dropped) == 1 and hook.resent == hook.dropped
        got = conn.receive_view_nowait()
        # before: None (a poll of 64 fragments completed nothing), the rest never read
        assert got is not None and bytes(got) == message
        assert conn.receive_view_nowait() is None
    finally:
        conn.close()

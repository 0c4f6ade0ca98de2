"""A hostile peer's frames that are no message keep one receive reading for as long as they come.

``Connection.receive_view_nowait`` polls again while a poll reads all it is allowed (64
fragments) and completes no message (issue 31: the rest of a long message may be there with no
signal to come). Frames that are never a message (PINGs, PONGs, frames of an unknown kind: each
read and dropped or answered) complete none either, so one receive read everything the peer had
made readable, and went on while more came: the stream server's loop, which serves every
session and bounds a session's pass by messages and bytes, read them all inside one call. The
receive now polls at most ``MAX_POLLS_PER_RECEIVE`` times and says None with ``poll_was_full``
set (the caller reads the session again in its next pass). Real UDP sockets on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aeron_spark.handshake.connection import _PONG, MAX_POLLS_PER_RECEIVE, Connection
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.testing import free_udp_port

from .conftest import wait_for

STREAM = 1002
FRAMES = 1800  # tiny PONGs: 64 bytes of term each, 115 KB: inside the 128 KiB receiver window


@pytest.fixture
def driver() -> Iterator[Driver]:
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    yield driver
    driver.close()


def test_attack_one_receive_reads_a_bounded_number_of_frames_that_are_no_message(
    driver: Driver,
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|mtu=1408|term-length=1m"
    sub = driver.add_subscription(channel, STREAM)
    pub = driver.add_publication(channel, STREAM)
    conn = Connection(pub, sub, peer="loopback", max_message_length=128 * 1024)
    try:
        wait_for(lambda: pub.is_connected and bool(sub.images), what="the publication")
        for _ in range(FRAMES):  # the hostile peer: frames no one asked for, no message
            wait_for(lambda: conn._offer(_PONG, b""), what="room in the publication")
        conn.send(b"the one message", timeout_s=30.0)
        (image,) = sub.images
        state = image._state  # the driver's side of the image: what arrived, in order
        wait_for(
            lambda: min(state.hwm, state.rebuild_position) >= pub.position,
            what="every frame to arrive",
        )
        reads: list[int] = []
        got = None
        while got is None and len(reads) < FRAMES:  # each call a pass of the server's loop
            before = conn.frames_dropped
            got = conn.receive_view_nowait()
            reads.append(conn.frames_dropped - before)
        print(f"{len(reads)} receives read {reads[:8]}... frames (most {max(reads)})")
        # before: 1 receive read all 1,800 frames
        assert got is not None and bytes(got) == b"the one message"
        assert sum(reads) == FRAMES
        assert max(reads) <= MAX_POLLS_PER_RECEIVE * 64
        assert len(reads) > 1
    finally:
        conn.close()

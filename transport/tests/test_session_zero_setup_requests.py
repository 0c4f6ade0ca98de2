"""A SETUP request naming session id 0 (a receiver that knows no session yet: Aeron's "pending
setup", a dynamic multi-destination receiver) costs the same whatever the number of
publications on the send socket (the eighteenth session's closing note).

Every such SM walked every publication of the socket: on a client holding 2,048 sessions on one
shared send socket, a spoofed one cost 2,048 looks, and counted 2,048 refusals. Now a request
naming a stream looks at that stream's publications only (each session has stream ids of its
own), and one naming stream 0 at the publications that take any session's SMs only (a secure
session's publication, which answers only SMs naming its own secret session id, ignores it:
counted once). Counted in Python bytecodes (a count of work, not a time), on a real driver's
send endpoint (``threading_mode="invoker"``: stepped by the test).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.frames import SmFlags, StatusMessage

from .test_conductor import _opcodes

STREAM_BASE = 1000


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock
    finally:
        sock.close()


def _send_endpoint_with(n: int, port: int) -> tuple[Driver, Any]:
    """A driver with ``n`` secure sessions' publications (a session id and a destination host
    each, stream ids of their own) and one open publication, all on one send socket."""
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    for k in range(n):
        driver.add_publication(
            f"{channel}|session-id={k + 1}|destination-host=127.0.0.1", STREAM_BASE + k
        )
    driver.add_publication(channel, STREAM_BASE + n)
    (ep,) = driver._conductor.send_endpoints.values()
    assert len(ep.publications) == n + 1
    return driver, ep


def _work_of_a_setup_request(n: int, port: int, stream_id: int) -> int:
    driver, ep = _send_endpoint_with(n, port)
    try:
        sm = StatusMessage(0, stream_id, 0, 0, 65536, 7, flags=int(SmFlags.SEND_SETUP)).encode()
        buf = bytearray(sm)
        source = ("127.0.0.2", 40000)
        ep.on_control(buf, len(buf), source, time.monotonic_ns())  # warm: caches, first calls
        before = driver.counters.snapshot(False)["status_messages_refused"]
        work = _opcodes(lambda: ep.on_control(buf, len(buf), source, time.monotonic_ns()))
        refused = driver.counters.snapshot(False)["status_messages_refused"] - before
        # refused by every secure session's publication it may be for: counted, per
        # publication of its stream, or once for stream 0 (main: once per publication)
        assert refused == 1, refused
        return work
    finally:
        driver.close()


@pytest.mark.parametrize("stream", ["its own stream", "stream 0"])
def test_a_session_zero_setup_request_costs_the_same_whatever_the_publications(
    receiver: socket.socket, stream: str
) -> None:
    port = receiver.getsockname()[1]

    def stream_of(n: int) -> int:
        return STREAM_BASE + n // 2 if stream == "its own stream" else 0

    small = _work_of_a_setup_request(32, port, stream_of(32))
    large = _work_of_a_setup_request(512, port, stream_of(512))
    assert large < 1.5 * small, (small, large)

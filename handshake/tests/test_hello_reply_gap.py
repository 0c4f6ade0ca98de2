"""A reply lost on its way to the client (a gap in the HELLO reply image) is sent again.

The server answers a HELLO with a COOKIE, the HELLO again with a WELCOME, both on the HELLO
channel's reply publication (one per HELLO publication, reliable: the client's image NAKs a
gap). Lose one of those frames on the reply path and the client must not hang, read another
reply as its own nor fail without a code: the gap is filled by a retransmission and the
handshake completes, within its timeout. Real UDP on 127.0.0.1; the client's driver drops the
chosen reply datagram once on receipt (``DropChosen``), as a lossy path would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from aeron_spark.handshake import Client, ClientConfig, HandshakeTimeoutError
from aeron_spark.handshake.config import REPLY_STREAM_ID
from aeron_spark.handshake.hello_channel import registry
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.testing import DataHeader, DropChosen


@pytest.mark.parametrize("linger_s", [0.0, 5.0])
@pytest.mark.parametrize("lost", [0, 1, 2], ids=["cookie", "welcome", "second-connects"])
def test_a_lost_reply_is_resent_and_the_handshake_completes(
    make_server: Callable[..., Any], tmp_path: Any, lost: int, linger_s: float
) -> None:
    server = make_server()
    seen: list[DataHeader] = []

    def choose(header: DataHeader) -> bool:
        if header.stream_id != REPLY_STREAM_ID:
            return False
        seen.append(header)
        return len(seen) == lost + 1

    hook = DropChosen(choose)
    driver = Driver(DriverConfig(write_counters_file=False, loss=hook)).start()
    try:
        client = Client(
            ClientConfig(
                key_store_dir=str(tmp_path / "keys"), timeout_s=20.0, hello_linger_s=linger_s
            ),
            driver=driver,
        )
        took = []
        for _ in range(2):  # the second over the lingering channel (a resumed HELLO) or a new one
            started = time.monotonic()
            conn = client.connect(server.endpoint)
            took.append(round(time.monotonic() - started, 2))
            try:
                conn.send(b"after a gap")
                assert conn.receive(30.0) == b"after a gap"
            finally:
                conn.close()
        print(f"lost reply {lost}: dropped {hook.dropped}, resent {hook.resent}, {took} s")
        assert hook.dropped, "no reply datagram was dropped"
        assert hook.resent == hook.dropped, "the lost reply was not sent again"
    finally:
        registry.close_all()
        driver.close()


def _drop_replies_from(first: int) -> DropChosen:
    """A media hook dropping every reply DATA datagram from the ``first``-th on, and each
    one's resends (the reply path black-holed mid-handshake)."""
    replies = 0

    def choose(header: DataHeader) -> bool:
        nonlocal replies
        if header.stream_id != REPLY_STREAM_ID:
            return False
        replies += 1
        return replies > first

    return DropChosen(choose, drop_resent=True)


@pytest.mark.parametrize("first", [0, 1], ids=["every-reply", "after-the-cookie"])
def test_a_reply_path_lost_for_good_fails_in_time_with_a_code(
    make_server: Callable[..., Any], tmp_path: Any, first: int
) -> None:
    server = make_server()
    hook = _drop_replies_from(first)
    driver = Driver(DriverConfig(write_counters_file=False, loss=hook)).start()
    try:
        client = Client(
            ClientConfig(key_store_dir=str(tmp_path / "keys"), timeout_s=3.0), driver=driver
        )
        started = time.monotonic()
        with pytest.raises(HandshakeTimeoutError) as raised:
            client.connect(server.endpoint)
        took = time.monotonic() - started
        print(f"replies from {first} lost: {hook.dropped} dropped, {took:.2f} s: {raised.value}")
        assert hook.dropped, "no reply was dropped"
        assert took < 3.0 + 2.0, f"a connect with a 3 s timeout took {took:.1f} s"
    finally:
        registry.close_all()
        driver.close()

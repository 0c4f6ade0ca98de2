"""A HELLO past the server's ``hellos_per_prefix_per_s`` is answered "busy" (the eighteenth
session's closing note: it was dropped unanswered, so each cost its client a whole timeout).

Real server and client over loopback UDP. The server takes one HELLO of a /24 a second (a
connect is one or two: a HELLO and its COOKIE round, or one with a resumption token); a HELLO
past the rate is answered REFUSE ``TOO_MANY_PENDING`` at once, which the client raises as
:class:`TooManyPendingError` (the connector backs off and retries it), within a fraction of its
timeout instead of a ``HandshakeTimeoutError`` after the whole of it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from aeron_spark.handshake.errors import TooManyPendingError

TIMEOUT_S = 20.0


def test_a_hello_past_the_rate_is_answered_busy_not_left_to_time_out(
    make_server: Any, make_client: Any
) -> None:
    server = make_server(hellos_per_prefix_per_s=1)
    client = make_client(timeout_s=TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(TooManyPendingError) as busy:
        # the bucket refills one a second: a connect's HELLO within the second after another
        # is past the rate (a few tries, should a loaded machine space them by a second)
        for _ in range(5):
            client.connect(server.endpoint).close()
    took = time.monotonic() - started
    assert "retry later" in str(busy.value), str(busy.value)
    assert took < TIMEOUT_S / 2, f"the busy answer came after {took:.1f} s"
    stats = server.stats()
    assert stats["rate_limited"] >= 1 and stats["rate_limited_answered"] >= 1, stats

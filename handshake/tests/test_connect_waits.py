"""What a connect waits on (issue 19: the handshake benchmark's connect spent most of its time
waiting, not computing).

The client waited for its HELLO and session publications to be connected in sleeps growing
from 0.1 ms to 2 ms (a status message connecting a publication "wakes nobody"), so each of the
two waits cost up to a sleep past the moment the publication was connected. It now waits on the
publication, which the status message that connects it wakes. Counted, not timed: over real
loopback handshakes the client's module sleeps zero times.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from aeron_spark.handshake import client as client_module


def test_a_connect_over_loopback_sleeps_no_fixed_time(
    make_server: Any, make_client: Any, monkeypatch: Any
) -> None:
    server = make_server(max_per_address=64)
    client = make_client()
    client.connect(server.endpoint).close()  # key store created, server key remembered
    sleeps: list[float] = []

    def counting_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    clock: Any = SimpleNamespace(
        monotonic=time.monotonic, monotonic_ns=time.monotonic_ns, sleep=counting_sleep
    )
    monkeypatch.setattr(client_module, "time", clock)
    for _ in range(10):
        conn = client.connect(server.endpoint)
        assert conn.is_connected
        conn.close()
    assert sleeps == [], f"fixed sleeps on the connect path: {sleeps}"

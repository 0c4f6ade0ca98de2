"""A receive waiting for a late reply sleeps until it comes, not in 50 ms slices (issue 31: the
benchmark's client waits ~70 ms a reply at 2,048 sessions, each slice a wake-up, a poll and a
connection check on its thread: Python calls and context switches a publish)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aeron_spark.handshake import Connection

_DELAY_S = 0.4  # the server answers this late: 8 slices of 50 ms, within one of 500 ms


def _delayed_echo(conn: Connection, message: bytes) -> None:
    time.sleep(_DELAY_S)  # on the server's loop: the test's only session waits with it
    conn.send(message)


def _counted(obj: Any, name: str, counts: dict[str, int]) -> None:
    """Count calls of ``obj.name`` (the real method, called through)."""
    real: Callable[..., Any] = getattr(obj, name)

    def counting(*args: Any) -> Any:
        counts[name] += 1
        return real(*args)

    setattr(obj, name, counting)


def test_a_late_reply_is_awaited_in_few_wakeups(make_server, make_client) -> None:
    server = make_server(echo=False)
    server.on_message = _delayed_echo
    conn = make_client().connect(server.endpoint)
    try:
        counts = {"wait": 0, "_ready": 0}
        _counted(conn.subscription, "wait", counts)
        _counted(conn.subscription, "_ready", counts)
        for i in range(3):
            began = time.monotonic()
            conn.send(b"late %d" % i)
            assert conn.receive(30.0) == b"late %d" % i
            assert time.monotonic() - began >= _DELAY_S * 0.9
        # one wait per reply (a spurious wake-up each allowed), a few readiness checks in it;
        # in 50 ms slices (main) 3 replies took 24+ waits and ~90 checks
        assert counts["wait"] <= 3 * 2, counts
        assert counts["_ready"] <= 3 * 8, counts
    finally:
        conn.close()


def test_a_receive_waits_before_it_polls(make_server, make_client) -> None:
    """A receive asked before its reply came waits first and polls once, when woken: an empty
    poll and a connected check through the transport's layers before the wait were ~18 of the
    client's ~90 Python calls a publish (issue 31)."""
    server = make_server(echo=False)
    server.on_message = _delayed_echo
    conn = make_client().connect(server.endpoint)
    try:
        counts = {"poll": 0, "_check_lost": 0}
        _counted(conn.subscription, "poll", counts)
        _counted(conn, "_check_lost", counts)
        for i in range(3):
            conn.send(b"late %d" % i)
            assert conn.receive(30.0) == b"late %d" % i
        # one poll a reply (a spurious wake-up allowed in all); main polled first, found
        # nothing and asked is_connected: 6 polls and 3 checks
        assert counts["poll"] <= 3 + 1, counts
        assert counts["_check_lost"] <= 1, counts
    finally:
        conn.close()


def test_a_wait_asks_ready_once_before_it_sleeps(make_server, make_client) -> None:
    """A waiter for a reply not yet come asks its readiness once before it sleeps and once
    when woken: the check before it counted itself as waiting was a third check a wait, four
    Python calls of the client's every publish (issue 31)."""
    server = make_server(echo=False)
    server.on_message = _delayed_echo
    conn = make_client().connect(server.endpoint)
    try:
        counts = {"_ready": 0}
        _counted(conn.subscription, "_ready", counts)
        for i in range(3):
            conn.send(b"late %d" % i)
            assert conn.receive(30.0) == b"late %d" % i
        # two a reply, a spurious wake-up allowed in all; main asked three a reply (9)
        assert counts["_ready"] <= 3 * 2 + 1, counts
    finally:
        conn.close()

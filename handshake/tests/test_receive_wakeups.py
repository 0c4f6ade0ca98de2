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


class _CountingGate:
    """The subscription's driver signal's gate (the real lock, called through), counting the
    waits that block on it: each ends by a notify or a slice's end, and a loaded machine makes
    more of them (a reply later than a 500 ms slice), so the bounds below are in these."""

    def __init__(self, gate: Any, counts: dict[str, int]) -> None:
        self._gate, self._counts = gate, counts

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking:
            self._counts["blocked"] += 1
        return bool(self._gate.acquire(blocking, timeout))

    def release(self) -> None:
        self._gate.release()


def _count_blocking(conn: Connection, counts: dict[str, int]) -> None:
    signal = conn.subscription._signal  # noqa: SLF001 - the test counts the real gate's waits
    counts["blocked"] = 0
    signal._gate = _CountingGate(signal._gate, counts)  # noqa: SLF001


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
        counts = {"poll": 0, "_check_lost": 0, "wait": 0}
        _counted(conn.subscription, "poll", counts)
        _counted(conn.subscription, "wait", counts)
        _counted(conn, "_check_lost", counts)
        for i in range(3):
            conn.send(b"late %d" % i)
            assert conn.receive(30.0) == b"late %d" % i
        # every poll after a wait, and a connected check only after a poll that found nothing
        # (a wait whose 500 ms slice ended before the reply: a loaded machine makes some);
        # main polled first, found nothing and asked is_connected: 6 polls and 3 checks for
        # 3 waits
        assert counts["poll"] <= counts["wait"], counts
        assert counts["_check_lost"] <= counts["wait"] - 3, counts
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
        counts = {"_ready": 0, "wait": 0}
        _counted(conn.subscription, "_ready", counts)
        _counted(conn.subscription, "wait", counts)
        _count_blocking(conn, counts)
        for i in range(3):
            conn.send(b"late %d" % i)
            assert conn.receive(30.0) == b"late %d" % i
        # once as a wait starts and once each time it wakes (a notify or a slice's end): two a
        # reply on a quiet machine; main asked three a reply (9 for 3 waits, each blocked once)
        assert counts["_ready"] <= counts["wait"] + counts["blocked"], counts
    finally:
        conn.close()

"""What an idle session's datagram costs a server's driver in Python calls on its guarded
sockets (issue 31: idle server CPU is Python work, ~3 datagrams a session-second, each a status
message or a heartbeat of a session the handshake trusted). Two real invoker-mode drivers over
loopback, the server's channels guarded as a handshake server's (``max-amplification=3``) and
the session's ids trusted, stepped on a made-up clock with nothing published: what they
exchange is heartbeats and status messages only. A ``sys.setprofile`` hook counts the Python
calls of the server's steps, divided by the datagrams it sent and received (a count that
depends on the code, not on the machine's speed or load)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.schedule import DueQueue

MS = 1_000_000
STEP_NS = 20 * MS
SESSIONS = 128
GUARD = "|max-amplification=3"


@pytest.fixture
def drivers() -> Iterator[tuple[Driver, Driver]]:
    cfg = DriverConfig(threading_mode="invoker", write_counters_file=False)
    server, client = Driver(cfg), Driver(cfg)
    try:
        yield server, client
    finally:
        server.close()
        client.close()


def _datagrams(d: Driver) -> int:
    snap = d.counters.snapshot(positions=False)
    return int(snap.get("datagrams_sent", 0)) + int(snap.get("datagrams_received", 0))


def _open(server: Driver, client: Driver) -> list[Any]:
    """Session-shaped streams as the handshake server opens them: a guarded request
    subscription (client -> server) and a guarded reply publication back, their ids trusted."""
    pubs = []
    port = 0
    for i in range(SESSIONS):
        sub = server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}|session-id={1000 + i}|idle-sm-interval=1s"
            + GUARD,
            100 + i,
        )
        port = port or sub.local_endpoints[0][1]
        pubs.append(
            client.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{port}|session-id={1000 + i}"
                "|idle-heartbeat-interval=2s",
                100 + i,
            )
        )
    back = 0
    reply_port = 0
    for i in range(SESSIONS):
        sub = client.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{back}|session-id={5000 + i}|idle-sm-interval=1s",
            5000 + i,
        )
        back = back or sub.local_endpoints[0][1]
        pubs.append(
            server.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{back}|session-id={5000 + i}"
                "|idle-heartbeat-interval=2s" + GUARD,
                5000 + i,
            )
        )
        reply_port = back
    assert reply_port
    server.trust_host("127.0.0.1", [1000 + i for i in range(SESSIONS)])
    server.trust_host("127.0.0.1", [5000 + i for i in range(SESSIONS)])
    return pubs


def test_an_idle_trusted_sessions_datagram_costs_the_server_few_python_calls(
    drivers: tuple[Driver, Driver],
) -> None:
    server, client = drivers
    pubs = _open(server, client)
    assert server.amplification is not None
    clock = time.monotonic_ns()
    deadline = time.monotonic() + 60
    while not all(p.is_connected for p in pubs):
        assert time.monotonic() < deadline, "the streams never connected"
        clock += STEP_NS
        server.do_work(clock)
        client.do_work(clock)
    for _ in range(3_000 * MS // STEP_NS):  # past the first SMs and heartbeats
        clock += STEP_NS
        server.do_work(clock)
        client.do_work(clock)
    calls = [0]

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    before = _datagrams(server)
    drops = server.amplification.drops
    for _ in range(6_000 * MS // STEP_NS):
        clock += STEP_NS
        client.do_work(clock)
        sys.setprofile(hook)
        try:
            server.do_work(clock)
            server.idle(0)  # what a runner asks before it sleeps (returns at once)
        finally:
            sys.setprofile(None)
    datagrams = _datagrams(server) - before
    # heartbeats in (0.5 a second a stream) and SMs out (1 a second a stream) and back
    assert datagrams >= SESSIONS * 6 * 2, datagrams
    assert server.amplification.drops == drops  # trusted: nothing of the session dropped
    per_datagram = calls[0] / datagrams
    # main: 11.0 (ledger.on_receive a datagram received, frame_session_id and may_send a
    # datagram sent, each agent's step inside a second method, a flush() a step for every
    # endpoint, a method and a list comprehension for the runner's socket check twice a
    # step, an idle image's kept SM and an idle stream's kept heartbeat each through a
    # method of its own); 8.0 now
    assert per_datagram <= 9.0, per_datagram


def test_rescheduling_an_idle_item_makes_no_size_check() -> None:
    """``DueQueue.schedule`` of an item taken at its deadline (an idle image's or
    publication's every step) makes two C calls (``dict.get``, ``heappush``); main made four
    (two ``len`` for a compaction that only a stale entry can need). Stale entries are still
    compacted: the heap stays bounded however often items are moved earlier or forgotten."""
    queue: DueQueue[int] = DueQueue()
    for item in range(100):
        queue.schedule(item, 1_000 + item)
    taken = queue.take(2_000)
    assert taken == list(range(100))
    c_calls = [0]

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            c_calls[0] += 1

    sys.setprofile(hook)
    try:
        for item in taken:
            queue.schedule(item, 3_000 + item)
    finally:
        sys.setprofile(None)
    assert c_calls[0] <= 2 * len(taken) + 1, c_calls[0]  # (+1: setprofile(None) itself)
    for round_ in range(50):  # moved earlier: a stale entry each, compacted as it grows
        for item in range(100):
            queue.schedule(item, 2_900 - round_ * 10 + item)
    for item in range(50):
        queue.forget(item)
    assert len(queue._heap) <= 2 * len(queue) + 64 + 1
    assert queue.take(10**9) == list(range(50, 100))

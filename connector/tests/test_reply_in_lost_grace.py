"""A session whose reply publication lost its client is given a grace (``LOST_GRACE_NS``,
``SessionSchedule.lose``) before the loop closes it: a live client whose receiver lapsed or
resubscribed speaks again within it. Two things ignored the grace:

* a reply sent during it, to a reply publication with no receiver, was dropped: the offer said
  NOT_CONNECTED, which Aeron means as "not now" (a subscriber may come: the publication keeps
  sending its setup), and the session's send took it for the end of the connection. Now the
  reply waits, as behind back pressure, and goes when the receiver is back (counted
  ``replies_awaiting_receiver``); one whose session closes unsent is counted
  ``replies_dropped``;
* the handshake server's walk of its connections for lost peers (every 10 s under the stream
  server) closed a connection in grace as any lost one. Now it leaves a connection in grace to
  the loop's re-check at the grace's end.

Real server, real sessions over loopback UDP: the client's driver ends its image of the reply
stream (the reply publication loses its receiver, its lost listener is called) and a new
subscription of the same channel joins."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.schedule import SessionSchedule
from aeron_spark.connector.session import protocol as proto
from aeron_spark.handshake import shared_driver

GRACE_NS = 60_000_000_000  # longer than any step of the test can take at load 20


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextmanager
def _session(
    tmp_path: Path, walk_ns: int | None = None
) -> Iterator[tuple[StreamServer, StreamClient]]:
    config = ServerConfig(directory=str(tmp_path / "srv"), port=0, encryption=False)
    server = StreamServer(config)
    server.schedule = SessionSchedule(lost_grace_ns=GRACE_NS)
    with server.start():
        assert server._listener is not None
        if walk_ns is not None:
            handshake = server._listener.server
            handshake.lost_peer_walk_ns = walk_ns
            handshake._next_reap_ns = 0
        settings = ClientSettings(
            endpoint=server.endpoint, encryption=False, keepalive_interval_s=10_000.0
        )
        with StreamClient.connect(settings) as client:
            assert client.list_streams() == []
            yield server, client


def _lose_receiver(server: StreamServer, client: StreamClient) -> tuple[Any, Any]:
    """End the client's image of its reply stream; returns (the old subscription, the server's
    link) once the reply publication has no receiver and the session is in grace."""
    (link,) = list(server._sessions)
    old = client._link.connection.subscription
    old.close()  # its driver ends the image: the reply publication's receiver goes
    _wait(lambda: server.schedule.in_grace(link), "the session's grace")
    assert link.awaits_receiver
    return old, link


def _resubscribe(client: StreamClient, old: Any, link: Any) -> None:
    """A new subscription of the reply stream, once its image of it has joined (or the
    server closed the session's connection: no image will come)."""
    new = shared_driver().add_subscription(old.channel, old.stream_id)
    conn = link.connection
    _wait(lambda: new.is_connected or conn.is_closed, "the new image of the reply stream")
    assert not conn.is_closed, "the server closed the session's connection in its grace"
    client._link.connection.subscription = new


def test_a_reply_sent_during_the_grace_reaches_the_client_that_comes_back(
    tmp_path: Path,
) -> None:
    with _session(tmp_path) as (server, client):
        counters = server.core.counters
        old, link = _lose_receiver(server, client)
        requests = counters["requests"]
        passes = server.schedule.passes
        # sent as is (a request would first replace the session that looks lost from here:
        # its reply stream's subscription is closed)
        request_id = 77
        client._send(proto.encode_request(request_id, "list_streams", {}))
        client._outstanding.add(request_id)
        # handled (its reply offered to the publication with no receiver), the pass over
        _wait(lambda: counters["requests"] > requests, "the request's handling")
        handled_by = server.schedule.passes
        _wait(lambda: server.schedule.passes > max(handled_by, passes + 1), "the next pass")
        assert not link.connection.publication.is_connected
        _resubscribe(client, old, link)
        # main: dropped at the offer (NOT_CONNECTED taken for a lost connection), the client
        # waited out its timeout
        assert client._wait_reply(request_id, time.monotonic() + 30.0) == []
        assert client.reconnects == 0
        assert counters["sessions_closed"] == 0
        assert counters["replies_awaiting_receiver"] >= 1
        assert counters.get("replies_dropped", 0) == 0


def test_the_lost_peer_walk_leaves_a_session_in_grace_to_its_recheck(tmp_path: Path) -> None:
    walk_ns = 100_000_000  # the handshake server's walk every 100 ms (10 s under the server)
    with _session(tmp_path, walk_ns) as (server, client):
        counters = server.core.counters
        handshake = server._listener.server
        old, link = _lose_receiver(server, client)
        # several walks while it is in grace (main: the first closed its connection)
        walk_after = time.monotonic_ns() + 5 * walk_ns
        _wait(lambda: handshake._next_reap_ns > walk_after, "walks of the connections")
        assert server.schedule.in_grace(link)
        assert not link.connection.is_closed
        _resubscribe(client, old, link)
        assert client.list_streams() == []
        assert client.reconnects == 0
        assert counters["sessions_closed"] == 0

"""A hostile, authorised client sends PONG frames nobody asked for: the server keeps none.

A session frame is a kind byte and a body; a PONG answers a PING and is kept for ``ping()`` to
match its token. The server never pings its sessions, so nothing ever took a PONG out again: every
PONG a client sent stayed in its server-side connection for the session's life, body and all
(a body up to the session's largest message, 8 MiB at the default term length). One client
with a valid key grew the server's memory without bound at the rate it could send. Real UDP
sockets on 127.0.0.1, a sealed session, the server's own loop.
"""

from __future__ import annotations

import os

from aeron_spark.handshake.connection import _PONG

from .conftest import wait_for

BODY = 32 * 1024
COUNT = 256  # 8 MiB of PONG bodies


def test_attack_unsolicited_pongs_are_not_kept_by_the_server(make_server, make_client) -> None:
    server = make_server()
    conn = make_client().connect(server.endpoint)
    try:
        wait_for(lambda: len(server.connections) == 1, what="the server's side of the session")
        (theirs,) = server.connections
        body = os.urandom(BODY)
        for _ in range(COUNT):
            conn._send_kind(_PONG, body, 30.0)  # the hostile client: a PONG no PING asked for
        conn.send(b"after the pongs")
        assert conn.receive(60.0) == b"after the pongs"  # the server read every PONG before it
        held = sum(len(b) for b, _ in theirs._pongs)
        kept, dropped = len(theirs._pongs), theirs.frames_dropped
        print(f"server holds {kept} PONGs, {held} bytes; dropped {dropped}")
        # before: 256 PONGs, 8,388,608 bytes held for the session's life
        assert held == 0
        assert theirs.frames_dropped >= COUNT
        assert server.stats()["pongs_unsolicited"] >= COUNT
        # the client's own pings still work (its PONG is asked for)
        assert 0 < conn.ping(30.0) < 30.0
    finally:
        conn.close()

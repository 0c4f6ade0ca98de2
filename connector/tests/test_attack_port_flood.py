"""A flood of a public port does not reach established sessions (issue 28 follow-up).

Before: every session's subscription shared the server's public HELLO-port UDP socket (and
every session publication the control port's), so a hostile sender flooding that port (valid
small SETUPs for new session ids, as fast as one thread sends them) made the kernel drop 70-95%
of the socket's datagrams, and the sessions' requests, status messages and heartbeats with them:
a replay took 15.7 s, and a session whose heartbeats were spaced out was lost. Now an
established session's client gets a socket of its own on each port (connected to the client's
address, ``SO_REUSEPORT``), which the flood does not reach.

Measured over real sockets, in the kernel's own count: the ``drops`` column of
``/proc/net/udp`` for the socket the server reads this session's datagrams on (the connected
one when there is one, else the public one). The flood is known to be strong enough when the
public socket's drops rise; the session's stay at 0, and a replay of ``REPLAY_BYTES`` completes
under the client's ordinary timeout (the old test needed 60 s: the bound is what fails a stall,
not a latency claim).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aeron_spark.connector.server.testing import (
    UdpSocketRow,
    client_for,
    messages_of,
    server_process,
    udp_sockets_of,
)
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID

PEER = Path(__file__).resolve().parents[2] / "transport" / "tests" / "hostile_peer.py"
STREAM = 10
REPLAY_BYTES = 2 * 1024 * 1024
MESSAGE_BYTES = 4096
TIMEOUT_S = 20.0  # the client's timeout of every request: what a stall fails on
FLOOD_SOURCE = "127.0.2.1"  # another /24 of the loopback network than the client's
FLOOD_DROPS = 1000  # the public socket's kernel drops that show the flood overflows it
FLOOD_WAIT_S = 60.0  # bounded wait for them (a loaded machine starts the flood slowly)


def _public_and_session(pid: int, port: int) -> tuple[UdpSocketRow, UdpSocketRow]:
    """The public socket, and the one this test's session's datagrams arrive on: the socket
    connected to the client's address if the server has one (this process is the only client),
    else the public one (what every session shared before)."""
    rows = udp_sockets_of(pid, port)
    public = [r for r in rows if not r.connected]
    connected = [r for r in rows if r.connected]
    assert len(public) == 1, rows
    assert len(connected) <= 1, rows  # one client process: one source address and port
    return public[0], (connected[0] if connected else public[0])


def _drops_of(pid: int, port: int, inode: int) -> int:
    return next(r.drops for r in udp_sockets_of(pid, port) if r.inode == inode)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flooded", "mode", "sessions"),
    [
        # the handshake port: valid small SETUPs for a new session id each time (the client's
        # requests, heartbeats and SMs for the server's replay arrive there)
        ("port", "images", "100000"),
        # the control port (port + 1): 60 KB datagrams (the client's SMs and NAKs for the
        # replay's publication arrive there)
        ("control port", "bulk", "1"),
    ],
)
def test_a_flood_of_a_public_port_drops_nothing_of_an_established_session(
    tmp_path, flooded: str, mode: str, sessions: str
) -> None:
    payloads = [b"%08d" % i + b"." * (MESSAGE_BYTES - 8) for i in range(REPLAY_BYTES // 4096)]
    with server_process(str(tmp_path / "srv")) as (proc, endpoint):
        host, port_text = endpoint.rsplit(":", 1)
        port = int(port_text) + (1 if flooded == "control port" else 0)
        with client_for(endpoint, timeout_s=TIMEOUT_S) as client:
            client.publish(STREAM, payloads)
            public, session = _public_and_session(proc.pid, port)
            peer = subprocess.Popen(
                [
                    sys.executable,
                    str(PEER),
                    host,
                    str(port),
                    str(HANDSHAKE_STREAM_ID),
                    "600",  # outlives the test: stopped by closing its stdin
                    sessions,
                    mode,
                    FLOOD_SOURCE,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert json.loads(peer.stdout.readline())["event"] == "started"
                deadline = time.monotonic() + FLOOD_WAIT_S
                while _drops_of(proc.pid, port, public.inode) - public.drops < FLOOD_DROPS:
                    assert time.monotonic() < deadline, "the flood never overflowed the port"
                    assert peer.poll() is None, "the hostile sender stopped"
                    time.sleep(0.2)
                recordings = [
                    r
                    for r in client.list_recordings([STREAM])
                    if r.recorded_position > r.start_position
                ]
                got = []
                for rec in recordings:
                    blocks = client.replay(
                        rec.recording_id, rec.start_position, rec.recorded_position
                    )
                    got += [
                        m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)
                    ]
                session_drops = _drops_of(proc.pid, port, session.inode) - session.drops
                public_drops = _drops_of(proc.pid, port, public.inode) - public.drops
                assert peer.poll() is None, "the hostile sender stopped before the test ended"
            finally:
                peer.stdin.close()
                peer.stdout.readline()
                peer.wait(30)
    assert got == payloads
    assert session_drops == 0, (
        f"the session's socket dropped {session_drops} datagrams (the public one "
        f"{public_drops}; {'the same socket' if session == public else 'its own'})"
    )
    assert session.inode != public.inode

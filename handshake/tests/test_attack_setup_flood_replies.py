"""Attack: a SETUP flood made the handshake server open reply publications.

The server opened a HELLO image's reply publication as soon as the image appeared (a SETUP
arrived: ``Server._read_hellos`` called ``_open_reply`` before reading anything), not when a
HELLO came. A sender of SETUP frames only, from many source ports, so made the server open one
publication per image (a session id, a term buffer, a sender entry each; bounded only by the
image caps: 4 per socket, ``max_per_address`` per address, ``2 * max_pending`` in all) for hosts
that never said HELLO. Fixed where the operator asks (``reply_on_hello_only``, the stream
server's ``--reply-on-hello-only``): the reply publication is opened for an image's first HELLO;
an image that says nothing gets only Aeron's status messages (its image's), and is counted
(``hello_images_waiting`` while it lives, ``hello_images_without_hello`` once gone). Clients of
this release say HELLO without waiting for the reply image; older ones wait for it, so by
default the server still opens the reply publication for the SETUP (they keep connecting).

Over real sockets: raw UDP sockets send the SETUPs, an in-process server on its own driver, an
honest client connecting meanwhile.
"""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

from aeron_spark.handshake import Client, ClientConfig, Server, ServerConfig
from aeron_spark.handshake.client import split_endpoint
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID, REPLY_STREAM_ID
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.frames import FrameType

from . import hostile as h

SERVER = "127.0.0.1"
FLOODER = "127.0.1.7"  # another /24 than the honest client's 127.0.0.1
SOCKETS = 12
PER_SOCKET = 4  # the HELLO subscription's image cap per source socket
IMAGES = SOCKETS * PER_SOCKET
WAIT_S = 60.0  # bounded waits, sized for a loaded 2-core machine


def _until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)


def _drain(socks: list[socket.socket], seconds: float) -> list[bytes]:
    """Every datagram the flooder's sockets receive within ``seconds``."""
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for sock in select.select(socks, [], [], left)[0]:
            got.append(sock.recv(65536))
    return got


def test_a_setup_only_flood_opens_no_reply_publication_and_gets_nothing_but_sms(
    tmp_path: Path,
) -> None:
    server = Server(
        ServerConfig(
            key_store_dir=str(tmp_path / "server-keys"), ipc=False, reply_on_hello_only=True
        ),
        on_message=lambda c, m: c.send(m),
    ).start()
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(SOCKETS)]
    try:
        for sock in socks:
            sock.bind((FLOODER, 0))
        port = (SERVER, server.port)
        for i, sock in enumerate(socks):
            for k in range(PER_SOCKET):
                sock.sendto(h.setup(0x5F000000 + i * PER_SOCKET + k, HANDSHAKE_STREAM_ID), port)
        _until(lambda: server.stats()["hello_images"] >= IMAGES, f"{IMAGES} HELLO images")

        # an honest client connects meanwhile, as before
        client = Client(ClientConfig(key_store_dir=str(tmp_path / "client-keys"), timeout_s=30.0))
        with client.connect(server.endpoint) as honest:
            honest.send(b"ping")
            assert honest.receive(30.0) == b"ping"
            received = _drain(socks, 1.0)  # and what the flooder got meanwhile, a moment more
            stats = server.stats()
        # at most the honest client's (its image said HELLO); before, one per flooder image too
        assert stats["reply_publications"] <= 1, stats
        assert stats["hello_images_waiting"] >= IMAGES, stats  # counted
        kinds = {int.from_bytes(d[6:8], "little") for d in received}
        assert kinds <= {int(FrameType.SM)}, (kinds, len(received))  # the images' SMs only
    finally:
        for sock in socks:
            sock.close()
        server.close()


def _reply_image_before_hello(server: Server, driver: Driver, wait_s: float) -> bool:
    """Whether a client that says nothing (a client before this release waits for its reply
    image before its first HELLO) sees the server's reply publication join within ``wait_s``."""
    host, port = split_endpoint(server.endpoint)
    pub = driver.add_publication(
        f"aeron:udp?endpoint={server.endpoint}|term-length=64k", HANDSHAKE_STREAM_ID
    )
    replies = driver.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:0|control={host}:{port + 1}|control-mode=dynamic"
        f"|session-id={pub.session_id}",
        REPLY_STREAM_ID,
    )
    try:
        _until(lambda: pub.is_connected, "the HELLO publication")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if replies.images:
                return True
            time.sleep(0.02)
        return False
    finally:
        pub.close()
        replies.close()


def test_by_default_a_client_before_this_release_still_sees_its_reply_image_before_hello(
    tmp_path: Path,
) -> None:
    """Compatibility: a client of the previous release waits for the reply image before its
    first HELLO; on a default server (the reply publication opened for the SETUP) it comes, so
    such a client connects; with ``reply_on_hello_only`` it does not (why the option is off by
    default, and why README says to turn it on only once every client is of this release)."""
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    servers = [
        Server(
            ServerConfig(
                key_store_dir=str(tmp_path / f"keys-{only}"), ipc=False, reply_on_hello_only=only
            ),
            on_message=lambda c, m: c.send(m),
        ).start()
        for only in (False, True)
    ]
    try:
        assert _reply_image_before_hello(servers[0], driver, WAIT_S)
        # hardened: nothing is opened for an image that has not said HELLO (2 s: far past the
        # default server's answer, a few hundred ms on a loaded machine)
        assert not _reply_image_before_hello(servers[1], driver, 2.0)
        assert servers[1].stats()["reply_publications"] == 0
    finally:
        for server in servers:
            server.close()
        driver.close()

"""Attack on issue 28 item 5's fix (README "Unauthenticated datagrams": an image is evicted for a
newcomer unless the server vouched for it, i.e. admitted a HELLO on it; the issue wanted "an
image ... cannot hold a slot an honest client needs; the per-prefix share of the cap is small").

A host that can get a HELLO admitted (anyone without ``--authorized-keys``; a listed client with
it) vouches for its HELLO images with one admitted HELLO each and never finishes the handshake
(no DONE: the pending handshake expires, the image stays vouched), then keeps the images alive
with 32-byte heartbeats. Vouched images are never evicted and have no per-/24 share of the
overall cap, so once they fill it every new client from any other network is refused at SETUP
(``images_refused``) and times out, for as long as the heartbeats go on. Defaults: the cap is
2 x max_pending = 512 images, 64 per IP address; 32 admitted HELLOs per /24 per 10 s fill it from
one /24 of 8 addresses in about 160 s. Here the server is scaled down (max_pending=4: a cap of
8 images, handshake_timeout 1 s) so the attack takes 3 s: an honest client in another /24 then
fails with HANDSHAKE_TIMEOUT (``images_refused`` grows, ``images_evicted`` stays 0).

Cause: ``handshake/server.py`` ``_on_hello`` (``image.vouch()``, about line 342) vouches at
admission, not when the session completes, and never un-vouches; ``transport/protocol/
receiver.py`` ``_victim`` (about line 555) finds nothing to evict at the overall cap when all
images are vouched, whichever /24 holds them. Fixed: an image is vouched while a handshake
or session admitted on it lives (``Server._unvouch``), so these expire back to evictable."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from aeron_spark.handshake import Client, ClientConfig, Server, ServerConfig
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID
from aeron_spark.handshake.errors import HandshakeError
from aeron_spark.handshake.machine import ClientHandshake
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.frames import DataFlags, FrameType
from aeron_spark.transport.protocol.term import encode_data_header

from . import hostile as h
from .test_hostile_network import _next_reply, _replies

SERVER = "127.0.0.1"
ATTACKER = "127.0.1.3"  # another /24 than the honest client's 127.0.0.1


def _aligned(payload: bytes) -> int:
    return (32 + len(payload) + 31) // 32 * 32


def _vouched_image(driver, server, sock, session_id: int) -> int:
    """A HELLO image at the attacker's own address with one admitted HELLO (the cookie round
    trip done honestly, the handshake then left to expire); the term offset after it."""
    port = (SERVER, server.port)
    _, replies = _replies(driver, server, ATTACKER, session_id)
    machine = ClientHandshake(lambda key: None)
    machine.start(time.monotonic_ns())
    hello = machine.hello()
    sock.sendto(h.setup(session_id, HANDSHAKE_STREAM_ID), port)
    sock.sendto(h.data(session_id, HANDSHAKE_STREAM_ID, hello), port)
    _next_reply(replies, machine, 5.0)
    again = machine.retry_hello
    assert again is not None, "no COOKIE for the attacker's own HELLO"
    sock.sendto(h.data(session_id, HANDSHAKE_STREAM_ID, again, term_offset=_aligned(hello)), port)
    machine.retry_hello = None
    assert _next_reply(replies, machine, 5.0) is not None, "the attacker's HELLO not admitted"
    return _aligned(hello) + _aligned(again)


def test_vouched_hello_images_of_one_network_do_not_keep_others_out(tmp_path: Path) -> None:
    server = Server(
        ServerConfig(
            key_store_dir=str(tmp_path / "server-keys"),
            ipc=False,
            max_pending=4,  # a HELLO image cap of 8
            max_pending_per_prefix=4,
            handshake_timeout_ns=1_000_000_000,
        ),
        on_message=lambda c, m: c.send(m),
    ).start()
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    images: list[tuple[socket.socket, int, int]] = []
    stop = threading.Event()

    def heartbeats() -> None:
        while not stop.wait(0.3):
            for sock, session_id, offset in list(images):
                header = encode_data_header(
                    0, DataFlags.UNFRAGMENTED, FrameType.DATA, offset, session_id,
                    HANDSHAKE_STREAM_ID, 7,
                )  # fmt: skip
                sock.sendto(header, (SERVER, server.port))

    keeper = threading.Thread(target=heartbeats, daemon=True)
    try:
        for sock in socks:
            sock.bind((ATTACKER, 0))
        keeper.start()
        for round_ in range(2):  # max_pending admitted at once: two rounds of 4
            for k in range(4):
                sock, session_id = socks[k // 2], 0x5E000000 + round_ * 16 + k
                images.append((sock, session_id, _vouched_image(driver, server, sock, session_id)))
            time.sleep(1.5)  # the pending handshakes expire; the images stay
        assert server.stats()["hello_images"] == 8
        before = server.driver.counters.snapshot()
        client = Client(ClientConfig(key_store_dir=str(tmp_path / "client-keys"), timeout_s=30.0))
        try:
            with client.connect(server.endpoint) as honest:
                honest.send(b"ping")
                assert honest.receive(30.0) == b"ping"
        except HandshakeError as exc:
            after = server.driver.counters.snapshot()
            raise AssertionError(
                f"an honest client from another /24 was kept out by 8 vouched HELLO images of "
                f"{ATTACKER} (images_refused +{after['images_refused'] - before['images_refused']}"
                f", images_evicted +{after['images_evicted'] - before['images_evicted']}): {exc}"
            ) from exc
    finally:
        stop.set()
        if keeper.is_alive():
            keeper.join(5)
        for sock in socks:
            sock.close()
        driver.close()
        server.close()

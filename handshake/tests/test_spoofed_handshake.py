"""Issue 28, item 1: a whole handshake spoofed from an allowed address, then a big request.

Over real UDP sockets on loopback. The server allows only 127.0.0.2 (the victim); the attacker
is at 127.0.0.3 (denied). Spoofing is modelled by binding: the attacker sends the frames of the
victim's address from a socket bound at 127.0.0.2 that it never reads (the test reads it, as the
victim's meter of what the server sent there); everything the attacker learns it reads at
127.0.0.3, on reply subscriptions of its own (the shared reply channel's, and the one naming the
spoofed HELLO publication's session id, from where it is).

On the old server the reply publication was one dynamic-MDC publication sending every reply to
every joined host: the attacker read the COOKIE and the WELCOME of the handshake it spoofed,
completed the session in the victim's name (the victim's address then trusted: no amplification
bound), and one request reflected megabytes to the victim. Now a reply goes only to the host of
its HELLO, the attacker never sees the cookie, no session is allocated, and what reaches the
victim stays within 3x of what was sent in its name.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from pathlib import Path

from aeron_spark.handshake import Server, ServerConfig
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID, REPLY_STREAM_ID
from aeron_spark.handshake.crypto import SealCounters
from aeron_spark.handshake.machine import ClientHandshake
from aeron_spark.handshake.messages import FrameKind
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler

from . import hostile as h
from .conftest import wait_for

SERVER = "127.0.0.1"
VICTIM = "127.0.0.2"
ATTACKER = "127.0.0.3"
RESPONSE = 1 << 20  # what the server sends back for one request (as a replay would)


class _Spoofed:
    """A socket at the victim's address the attacker sends from and never reads; the bytes sent
    from it, and (read by the test, as the victim) the bytes that reached it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((VICTIM, 0))
        self.sent = 0
        self.received = 0

    def send(self, payload: bytes, to: tuple[str, int]) -> None:
        self.sent += self.sock.sendto(payload, to)

    def meter(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.sock], [], [], left)[0]:
                self.received += len(self.sock.recv(65536))


def _offset_after(payloads: list[bytes]) -> int:
    return sum((32 + len(p) + 31) // 32 * 32 for p in payloads)


def _spoofed_handshake_then(server, request: bytes) -> dict:
    """The whole attack on ``server`` (a handshake Server, as ``stats()`` gives), ending with
    ``request`` sent on the session if it completes; what it measured."""
    port, control = (SERVER, server.port), (SERVER, server.control_port)
    before = server.stats()
    attacker_driver = Driver(DriverConfig(write_counters_file=False)).start()
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind((ATTACKER, 0))
    victim = _Spoofed()
    spoofed_session = 0x2C000001
    # the attacker's reply subscriptions at its own address: the shared reply channel, and the
    # replies to the spoofed HELLO publication's session id
    replies = (
        f"aeron:udp?endpoint={ATTACKER}:0|control={SERVER}:{server.control_port}"
        "|control-mode=dynamic"
    )
    subs = [
        attacker_driver.add_subscription(replies, REPLY_STREAM_ID),
        attacker_driver.add_subscription(
            f"{replies}|session-id={spoofed_session}", REPLY_STREAM_ID
        ),
    ]
    machine = ClientHandshake(lambda key: None)
    machine.start(time.monotonic_ns())
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda p, hdr: got.append(bytes(p)))

    def next_reply(seconds: float):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for sub in subs:
                sub.poll(assembler, 10)
            while got:
                details = machine.on_reply(got.pop(0))
                if details is not None or machine.retry_hello is not None:
                    return details
            victim.meter(0.005)
        return None

    try:
        # a HELLO image of the attacker's own (its address is denied: it only wants to join)
        attacker.sendto(h.setup(0x2C0000AA, HANDSHAKE_STREAM_ID), port)
        deadline = time.monotonic() + 3.0
        while not any(sub.images for sub in subs) and time.monotonic() < deadline:
            time.sleep(0.01)  # joined (the old server), or never (a server that lets nobody)
        # the spoofed handshake: SETUP, HELLO, a join of the replies in the victim's name
        hellos = [machine.hello()]
        victim.send(h.setup(spoofed_session, HANDSHAKE_STREAM_ID), port)
        victim.send(h.data(spoofed_session, HANDSHAKE_STREAM_ID, hellos[0]), port)
        for session in (0, spoofed_session):  # the joins a reply subscription there would send
            victim.send(h.sm(session, REPLY_STREAM_ID, setup=True), control)
        details = next_reply(3.0)
        if machine.retry_hello is not None:  # it read the COOKIE: answer it from the victim
            hellos.append(machine.retry_hello)
            machine.retry_hello = None
            victim.send(
                h.data(
                    spoofed_session,
                    HANDSHAKE_STREAM_ID,
                    hellos[1],
                    term_offset=_offset_after(hellos[:1]),
                ),
                port,
            )
            details = next_reply(3.0)
        if details is not None:  # it read the WELCOME: open the pair from the victim
            c2s = (details.c2s_session_id, details.c2s_stream_id)
            geometry = {"term_length": details.term_length, "mtu": details.mtu}
            done = machine.done()
            victim.send(h.setup(*c2s, **geometry), port)
            victim.send(h.data(*c2s, done), port)
            s2c = (details.s2c_session_id, details.s2c_stream_id)
            victim.send(h.sm(*s2c, setup=True), control)
            victim.meter(0.3)
            # the request, sealed with the session's keys, then blind flow-control SMs (one of
            # four term ids is ahead of the unseen initial term id: the window opens)
            sealer, _ = machine.keys.client_sealer(SealCounters())
            sealed = sealer.seal(bytes([FrameKind.DATA]) + request)
            victim.send(h.data(*c2s, sealed, term_offset=_offset_after([done])), port)
            for _ in range(20):
                for quarter in range(4):
                    term = quarter << 30
                    victim.send(h.sm(*s2c, term_id=term - (1 << 32) * (term >> 31)), control)
                victim.meter(0.1)
        victim.meter(3.0)  # what keeps coming (heartbeats, retransmissions, the response)
        stats = server.stats()
        return {
            "sent_from_victim": victim.sent,
            "received_by_victim": victim.received,
            "factor": round(victim.received / victim.sent, 3),
            "welcome_read_by_attacker": details is not None,
            "accepted": stats["accepted"] - before["accepted"],
            "connected": stats["connected"] - before["connected"],
            "amplification_drops": stats["amplification_drops"],
        }
    finally:
        for sub in subs:
            sub.close()
        attacker_driver.close()
        attacker.close()
        victim.sock.close()


def _check(measured: dict, what: str) -> None:
    print(f"{what} " + json.dumps(measured))
    assert not measured["welcome_read_by_attacker"], "the attacker read a spoofed WELCOME"
    assert measured["accepted"] == 0 and measured["connected"] == 0
    assert measured["factor"] <= 3, measured


def test_a_whole_spoofed_handshake_then_a_request_reflects_at_most_3x(tmp_path: Path) -> None:
    def respond(conn, message: bytes) -> None:
        def send() -> None:
            for _ in range(RESPONSE // 8192):
                conn.send(b"\x00" * 8192, timeout_s=5.0)

        threading.Thread(target=send, daemon=True).start()

    server = Server(
        ServerConfig(key_store_dir=str(tmp_path / "keys"), allow=(VICTIM,), ipc=False),
        on_message=respond,
    ).start()
    try:
        _check(_spoofed_handshake_then(server, b"replay"), "spoofed handshake")
    finally:
        server.close()


def test_a_whole_spoofed_handshake_then_a_replay_request_to_the_stream_server(
    tmp_path: Path,
) -> None:
    # The review's attack on the stream server itself: a recording of 4 MiB, and one `replay`
    # request on the spoofed session (3,132x in the review).
    from aeron_spark.connector.server import ServerConfig as StreamServerConfig
    from aeron_spark.connector.server import StreamServer
    from aeron_spark.connector.server.testing import client_for
    from aeron_spark.connector.session.protocol import encode_request

    config = StreamServerConfig(
        directory=str(tmp_path / "srv"), port=0, allow=(SERVER, VICTIM), mtu=4096
    )
    with StreamServer(config) as stream_server:
        with client_for(stream_server.endpoint, encryption=True) as honest:  # from 127.0.0.1
            honest.publish(10, [bytes(4096)] * 1024)
            (rec,) = honest.list_recordings(stream_ids=[10])
        request = encode_request(1, "replay", {"recording_id": rec.recording_id, "start": 0})
        _check(
            _spoofed_handshake_then(stream_server._listener.server, request),
            "spoofed handshake + replay",
        )


def test_a_hello_streams_reply_publication_goes_with_it(tmp_path: Path) -> None:
    # Each HELLO image's reply publication is the server's to free: once the client's HELLO
    # channel closes (hello_linger_s=0: when its handshake ends), nothing of it stays.
    from aeron_spark.handshake import Client, ClientConfig

    server = Server(
        ServerConfig(key_store_dir=str(tmp_path / "keys"), ipc=False),
        on_message=lambda c, m: c.send(m),
    ).start()
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    try:
        before = len(server.driver._publications)
        client = Client(
            ClientConfig(key_store_dir=str(tmp_path / "client"), hello_linger_s=0), driver=driver
        )
        for _ in range(3):
            with client.connect(server.endpoint) as conn:
                conn.send(b"ping")
                assert conn.receive(30.0) == b"ping"
        wait_for(
            lambda: (
                server.stats()["hello_images"] == 0
                and server.stats()["connections"] == 0
                and len(server.driver._publications) == before
            ),
            what="the HELLO images, their reply publications and the sessions gone",
        )
        assert server.stats()["reply_publications_failed"] == 0
    finally:
        driver.close()
        server.close()

"""Attack: reflection towards a spoofed address through a HELLO's reply publication, on a server
with ``reply_on_hello_only`` (the reply publication opened for the image's first HELLO) and
clients that say HELLO without waiting for the reply image.

A spoofer that names a victim's address sends a whole HELLO stream in its name (SETUP, the
HELLO), joins the reply publication in the victim's name (a status message naming the reply's
session id, which is the HELLO image's own and so the spoofer's choice) and keeps both alive
with heartbeats and status messages, so the server's COOKIE, the reply publication's SETUP and
heartbeats and the HELLO image's status messages all go to the victim. Held: the victim gets at
most 3 times what was sent in its name (the driver's amplification ledger), the server counts
what it dropped, and nothing is allocated for the victim (no session).

Over real sockets: raw IPv4 sockets forge the source address (root or CAP_NET_RAW, as CI has),
an in-process server on its own driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from aeron_spark.handshake import Server, ServerConfig
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID, REPLY_STREAM_ID
from aeron_spark.handshake.machine import ClientHandshake
from aeron_spark.transport.protocol.frames import FrameType

from . import hostile as h

pytestmark = pytest.mark.skipif(
    h.spoof_unavailable() is not None, reason=str(h.spoof_unavailable())
)

SERVER = "127.0.0.1"
VICTIM = "127.0.0.71"
SESSION = 0x3B000001
ROUNDS = 15  # 100 ms apart: the image and the reply's destination kept alive for 1.5 s


def test_a_spoofed_hello_joined_in_the_victims_name_reflects_at_most_3x(tmp_path: Path) -> None:
    server = Server(
        ServerConfig(
            key_store_dir=str(tmp_path / "server-keys"), ipc=False, reply_on_hello_only=True
        ),
        on_message=lambda c, m: c.send(m),
    ).start()
    victim = h.Victim(VICTIM)
    spoofer = h.Spoofer()
    try:
        port, control = (SERVER, server.port), (SERVER, server.control_port)
        machine = ClientHandshake(lambda key: None)
        machine.start(0)
        hello = machine.hello()
        spoofer.send(victim.address, port, h.setup(SESSION, HANDSHAKE_STREAM_ID))
        spoofer.send(victim.address, port, h.data(SESSION, HANDSHAKE_STREAM_ID, hello))
        offset = (32 + len(hello) + 31) & -32
        for r in range(ROUNDS):
            # the reply publication joined in the victim's name, and the HELLO image kept alive
            spoofer.send(victim.address, control, h.sm(SESSION, REPLY_STREAM_ID, setup=r == 0))
            spoofer.send(
                victim.address, port, h.data(SESSION, HANDSHAKE_STREAM_ID, b"", term_offset=offset)
            )
            h.wait_quiet([victim], 0.1)
        # the reply publication closes 2 s after the image is silent; the image's status
        # messages go on until its liveness (10 s) ends, within the same ledger
        h.wait_quiet([victim], 2.5)
        sent = spoofer.bytes_sent[VICTIM]
        stats = server.stats()
        print(
            f"reflection: {sent} bytes in the victim's name, {victim.bytes} to it, types "
            f"{sorted(victim.frame_types())}, drops {stats.get('amplification_drops')}"
        )
        assert victim.bytes > 0  # the attack reached the victim (SETUPs and SMs) ...
        assert victim.bytes <= 3 * sent, (victim.bytes, sent)  # ... within 3x
        # the COOKIE never went: the reply needs a subscriber that answers at the address
        assert int(FrameType.DATA) not in victim.frame_types(), victim.frame_types()
        assert not server.core.sessions
    finally:
        spoofer.close()
        victim.close()
        server.close()

"""A hostile, unauthenticated sender in its own process (run: python hostile_peer.py ARGS).

    python hostile_peer.py HOST PORT STREAM_ID SECONDS [SESSIONS] [MODE] [SOURCE]

Sends crafted datagrams to ``HOST:PORT`` on ``STREAM_ID`` as fast as one thread can, until
``SECONDS`` pass or stdin closes (issue 15, item 3): for each of ``SESSIONS`` session ids
(default 8) a SETUP with a 1 GiB term length and a 65504-byte mtu, a DATA frame ~512 MiB ahead
of the SETUP's position, a DATA frame just past half a term, a heartbeat 512 MiB ahead, and a
SETUP with the smallest term but an mtu no receiver should accept. ``MODE`` ``images`` sends
instead valid small SETUPs (64 KiB term), each followed by a heartbeat, for a new session id
every time (an image flood: each would cost the receiver a log, SMs and a slot); ``bulk``
60,000-byte DATA frames nobody takes (a flood by bytes, e.g. of a control port). Prints one
JSON line at the start (``{"event": "started"}``) and one at the end with how many datagrams
it sent. ``SOURCE`` is the local address to send from (e.g. ``127.0.2.1``: another /24 of the
loopback network than the clients', so the flood shares no per-network limit with them).
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time

from aeron_spark.transport.protocol.frames import DataFlags, FrameType, SetupFrame
from aeron_spark.transport.protocol.term import encode_data_header

GIB = 1024**3
MIB = 1024**2


def crafted_datagrams(stream_id: int, session_id: int) -> list[bytes]:
    """The crafted SETUP/DATA datagrams of one session id (see the module docstring)."""
    term_length = GIB
    initial = 7
    setup = SetupFrame(0, session_id, stream_id, initial, initial, term_length, 65504).encode()
    payload = b"\xab" * 1024
    far = 512 * MIB - 4096
    data_far = (
        encode_data_header(
            32 + len(payload),
            DataFlags.UNFRAGMENTED,
            FrameType.DATA,
            far,
            session_id,
            stream_id,
            initial,
        )
        + payload
    )
    half = term_length // 2 - 32 - len(payload)
    data_half = (
        encode_data_header(
            32 + len(payload),
            DataFlags.UNFRAGMENTED,
            FrameType.DATA,
            half,
            session_id,
            stream_id,
            initial,
        )
        + payload
    )
    heartbeat = encode_data_header(
        0, DataFlags.UNFRAGMENTED, FrameType.DATA, far, session_id, stream_id, initial
    )
    small_term_huge_mtu = SetupFrame(
        0, session_id ^ 0x5A5A, stream_id, initial, initial, 64 * 1024, 32 * 1024
    ).encode()
    return [setup, data_far, data_half, heartbeat, small_term_huge_mtu]


def image_flood_datagrams(stream_id: int, session_id: int) -> list[bytes]:
    """A valid small SETUP and a heartbeat for one session id (MODE ``images``)."""
    setup = SetupFrame(0, session_id, stream_id, 7, 7, 64 * 1024, 1408).encode()
    heartbeat = encode_data_header(
        0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, session_id, stream_id, 7
    )
    return [setup, heartbeat]


def bulk_datagrams(stream_id: int, session_id: int) -> list[bytes]:
    """A 60,000-byte DATA frame far outside any window (MODE ``bulk``): on a publication's
    control port (which reads only SMs, NAKs and RTTMs) it is read and ignored, so a flood of
    them fills the socket's buffer by bytes rather than by the work each costs."""
    payload = b"\xcd" * (60_000 - 32)
    header = encode_data_header(
        32 + len(payload),
        DataFlags.UNFRAGMENTED,
        FrameType.DATA,
        512 * MIB,
        session_id,
        stream_id,
        7,
    )
    return [header + payload]


def stdin_closed() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and not os.read(sys.stdin.fileno(), 1024)


def main(argv: list[str]) -> int:
    host, port, stream_id, seconds = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    sessions = int(argv[4]) if len(argv) > 4 else 8
    mode = argv[5] if len(argv) > 5 else "crafted"
    source = argv[6] if len(argv) > 6 else None
    make = {"images": image_flood_datagrams, "bulk": bulk_datagrams}.get(mode, crafted_datagrams)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    packets = [p for s in range(sessions) for p in make(stream_id, 0x0BAD0000 + s)]
    sent = 0
    errors = 0
    sys.stdout.write(json.dumps({"event": "started", "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    deadline = time.monotonic() + seconds
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        if source is not None:
            sock.bind((source, 0))
        target = (host, port)
        sendto = sock.sendto
        running = True
        while running:
            for packet in packets:
                try:
                    sendto(packet, target)
                    sent += 1
                except (BlockingIOError, InterruptedError):
                    select.select([], [sock], [], 0.01)  # wait for room, never spin
                except OSError:
                    errors += 1  # e.g. ECONNREFUSED from an ICMP error: keep going
                if (sent + errors) % 4096 == 0 and (time.monotonic() >= deadline or stdin_closed()):
                    running = False
                    break
    sys.stdout.write(json.dumps({"event": "done", "sent": sent, "errors": errors}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

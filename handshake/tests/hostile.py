"""Helpers for the hostile-network tests: hand-made Aeron frames, a victim socket that counts
what the server sends it, and (from ``transport.testing``) datagrams with a forged source
address (raw IPv4 socket, ``IP_HDRINCL``: needs root or CAP_NET_RAW, which CI has)."""

from __future__ import annotations

import os
import select
import socket
import time
from typing import Any

from aeron_spark.transport.protocol.frames import (
    DataFlags,
    FrameType,
    NakFrame,
    RttMeasurement,
    SetupFrame,
    SmFlags,
    StatusMessage,
)
from aeron_spark.transport.protocol.term import encode_data_header
from aeron_spark.transport.testing import Spoofer, spoof_unavailable

Address = tuple[str, int]


class Victim:
    """A UDP socket at an address a spoofer names as its source: it never sends anything and
    counts (and keeps) every datagram that reaches it."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((host, port))
        self.address: Address = self.sock.getsockname()
        self.datagrams: list[tuple[bytes, Address]] = []
        self.bytes = 0

    def drain(self, timeout_s: float = 0.0) -> int:
        """Read what has arrived (waiting up to ``timeout_s`` for the first); datagrams read."""
        got = 0
        wait = timeout_s
        while select.select([self.sock], [], [], wait)[0]:
            data, source = self.sock.recvfrom(65536)
            self.datagrams.append((data, source))
            self.bytes += len(data)
            got += 1
            wait = 0.0
        return got

    def frame_types(self) -> set[int]:
        return {int.from_bytes(d[6:8], "little") for d, _ in self.datagrams if len(d) >= 8}

    def close(self) -> None:
        self.sock.close()


def wait_quiet(victims: list[Victim], seconds: float) -> None:
    """Keep draining the victims for ``seconds`` (what the server sends them meanwhile)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready = select.select([v.sock for v in victims], [], [], left)[0]
        for victim in victims:
            if victim.sock in ready:
                victim.drain()


# ------------------------------------------------------------------ frames


def sm(
    session_id: int,
    stream_id: int,
    *,
    setup: bool = False,
    window: int = 1 << 20,
    term_id: int = 0,
    receiver_id: int | None = None,
) -> bytes:
    rid = receiver_id if receiver_id is not None else int.from_bytes(os.urandom(7), "little")
    flags = SmFlags.SEND_SETUP if setup else 0
    return StatusMessage(session_id, stream_id, term_id, 0, window, rid, flags=flags).encode()


def nak(session_id: int, stream_id: int, term_id: int, offset: int, length: int) -> bytes:
    return NakFrame(session_id, stream_id, term_id, offset, length).encode()


def setup(
    session_id: int,
    stream_id: int,
    *,
    term_length: int = 64 * 1024,
    mtu: int = 1408,
    term_id: int = 7,
) -> bytes:
    return SetupFrame(0, session_id, stream_id, term_id, term_id, term_length, mtu).encode()


def data(
    session_id: int, stream_id: int, payload: bytes, *, term_id: int = 7, term_offset: int = 0
) -> bytes:
    header = encode_data_header(
        32 + len(payload),
        DataFlags.UNFRAGMENTED,
        FrameType.DATA,
        term_offset,
        session_id,
        stream_id,
        term_id,
    )
    return header + payload


def rttm(session_id: int, stream_id: int) -> bytes:
    return RttMeasurement(session_id, stream_id, time.monotonic_ns(), 0, 1, flags=0x80).encode()


def session_ids(driver: Any) -> list[tuple[int, int]]:
    """(session id, stream id) of every publication of ``driver`` (what a strong attacker who
    learnt them all would name)."""
    return [(p._state.session_id, p._state.stream_id) for p in list(driver._publications)]


__all__ = [
    "Spoofer",
    "Victim",
    "data",
    "nak",
    "rttm",
    "session_ids",
    "setup",
    "sm",
    "spoof_unavailable",
    "wait_quiet",
]

"""The control frames a publication sends besides data (Aeron's ``aeron_network_publication.c``
setup and heartbeat parts), sans I/O: SETUP, the heartbeat (a zero-length DATA frame at the
sender position, EOS when the stream is drained after close) and the RTTM reply.

Rules (Aeron's, so a real Aeron receiver sees what it expects):

* Before the first SM only SETUP goes out, every ``SETUP_INTERVAL_NS``; after it, SETUP again
  only to a destination that asks (SM with SEND_SETUP), never after EOS.
* A heartbeat goes out when no data was sent for ``HEARTBEAT_INTERVAL_NS``
  (Aeron's ``PUBLICATION_HEARTBEAT_TIMEOUT``), so a receiver learns the sender position (a lost
  last datagram becomes a gap) and keeps the image alive (its liveness timeout is 10 s). An idle
  stream keeps that cadence unless its channel asks for ``idle-heartbeat-interval`` (Aeron's
  driver-wide ``aeron.publication.heartbeat.timeout``, per channel: our own sessions' channels,
  issue 31): then the first heartbeat after data still goes after 100 ms (a lost last datagram
  is found as soon), the following ones that far apart (at most ``IDLE_HEARTBEAT_INTERVAL_MAX_NS``,
  a fifth of the image liveness; due on the idle grid, ``schedule.IDLE_GRID_NS``: never later,
  at most 20 ms sooner); a closing stream's (EOS) heartbeats keep 100 ms.
"""

from __future__ import annotations

from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DataFlags,
    FrameType,
    RttMeasurement,
    SetupFrame,
)
from aeron_spark.transport.protocol.logbuffer import wrap_int32

SETUP_INTERVAL_NS = 100_000_000
HEARTBEAT_INTERVAL_NS = 100_000_000
# The longest idle heartbeat interval a channel may ask for (``idle-heartbeat-interval``): a fifth
# of an image's liveness timeout (10 s), so an idle image hears five before it would time out.
IDLE_HEARTBEAT_INTERVAL_MAX_NS = 2_000_000_000
_UNFRAGMENTED = int(DataFlags.UNFRAGMENTED)  # ints: an IntFlag operation builds an enum member
_UNFRAGMENTED_EOS = int(DataFlags.UNFRAGMENTED | DataFlags.EOS)


def setup_frame(
    position: int,
    *,
    session_id: int,
    stream_id: int,
    initial_term_id: int,
    term_length: int,
    mtu: int,
) -> bytes:
    """The SETUP of a stream whose sender is at ``position``."""
    shift = term_length.bit_length() - 1
    return SetupFrame(
        term_offset=position & (term_length - 1),
        session_id=session_id,
        stream_id=stream_id,
        initial_term_id=initial_term_id,
        active_term_id=wrap_int32(initial_term_id + (position >> shift)),
        term_length=term_length,
        mtu=mtu,
    ).encode()


def heartbeat_frame(
    position: int,
    end_of_stream: bool,
    *,
    session_id: int,
    stream_id: int,
    initial_term_id: int,
    term_length: int,
) -> bytes:
    """A heartbeat at ``position`` (with the EOS flag when ``end_of_stream``)."""
    shift = term_length.bit_length() - 1
    flags = _UNFRAGMENTED_EOS if end_of_stream else _UNFRAGMENTED
    return DATA_HEADER.pack(
        0,
        0,
        flags,
        FrameType.DATA,
        position & (term_length - 1),
        session_id,
        stream_id,
        wrap_int32(initial_term_id + (position >> shift)),
        0,
    )


def rttm_reply(rttm: RttMeasurement, session_id: int, stream_id: int) -> bytes:
    """The answer to an RTTM asking for one: its echo timestamp sent back."""
    reply = RttMeasurement(session_id, stream_id, rttm.echo_timestamp, 0, rttm.receiver_id, 0)
    return reply.encode()

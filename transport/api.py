"""The client-facing contract shared by every media (UDP and IPC): result codes and protocols.

``Publication.offer`` returns the new stream position (> 0) or one of the negative codes below,
as Aeron's ``Publication.offer`` does. ``Subscription.poll`` and ``Image.poll`` deliver fragments
to a handler ``handler(payload: memoryview, header: Header)``; the memoryview and the header are
only valid during the call. ``Image.block_poll`` hands whole runs of raw frames (used by recording).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any, Protocol

from aeron_spark.transport.errors import (
    BackPressuredError,
    ClosedError,
    MaxPositionExceededError,
    NotConnectedError,
)
from aeron_spark.transport.protocol.term import FragmentHandler, Header

NOT_CONNECTED = -1
BACK_PRESSURED = -2
ADMIN_ACTION = -3
CLOSED = -4
MAX_POSITION_EXCEEDED = -5

RESULT_NAMES = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}


class ControlledAction(enum.IntEnum):
    """What a controlled-poll handler tells the reader to do next (Aeron's ``Action``)."""

    ABORT = 1  # do not consume this fragment; stop
    BREAK = 2  # consume it and stop
    COMMIT = 3  # consume it and commit the position now
    CONTINUE = 4  # consume it and go on


class ReceiveHook(Protocol):
    """Sits between a UDP socket and the state machines: ``receive(endpoint)`` returns the next
    datagram to deliver (``(buffer, length, source)`` or None), reading the socket through
    ``endpoint.raw_receive()`` as it likes (dropping, holding back, duplicating)."""

    def receive(self, endpoint: Any) -> tuple[Any, int, Any] | None: ...


class MediaHook(Protocol):
    """What ``DriverConfig(loss=...)`` takes: a factory of one :class:`ReceiveHook` per UDP
    endpoint, given the driver's system counters. Tests install one
    (``transport.testing.LossConfig``); production code never imports them."""

    def receive_hook(self, counters: Any) -> ReceiveHook: ...


# handler(term: memoryview, term_offset: int, length: int, session_id: int, term_id: int)
BlockHandler = Callable[[memoryview, int, int, int, int], object]
ControlledFragmentHandler = Callable[[memoryview, Header], ControlledAction]


def offer_blocking(
    pub: PublicationLike,
    wait_for_limit: Callable[[float], bool],
    payload: bytes | bytearray | memoryview,
    reserved_value: int,
    timeout_s: float,
) -> int:
    """``pub.offer`` retried on BACK_PRESSURED/ADMIN_ACTION/NOT_CONNECTED until ``timeout_s``;
    ``wait_for_limit(deadline)`` waits (the publication's own way) and says False at the deadline.

    Returns the new position; raises :class:`NotConnectedError`, :class:`BackPressuredError`,
    :class:`MaxPositionExceededError` or :class:`ClosedError`.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = pub.offer(payload, reserved_value)
        if result > 0:
            return result
        if result == CLOSED:
            raise ClosedError(f"publication {pub.session_id}/{pub.stream_id} is closed")
        if result == MAX_POSITION_EXCEEDED:
            raise MaxPositionExceededError(
                f"publication {pub.session_id} reached its maximum position",
                "MAX_POSITION_EXCEEDED",
            )
        if not wait_for_limit(deadline):
            name = RESULT_NAMES.get(result, str(result))
            if result == NOT_CONNECTED:
                raise NotConnectedError(
                    f"no subscriber connected to {pub.channel} stream {pub.stream_id} "
                    f"within {timeout_s} s",
                    name,
                )
            assert result in (BACK_PRESSURED, ADMIN_ACTION)
            raise BackPressuredError(
                f"publication {pub.session_id}/{pub.stream_id} stayed {name} "
                f"for {timeout_s} s "
                f"(position {pub.position}, limit {pub.position_limit})",
                name,
            )


class PublicationStream(Protocol):
    """What every publication, and every media's publication log, tells about its stream."""

    session_id: int
    stream_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    max_message_length: int
    max_payload_length: int

    @property
    def position(self) -> int: ...
    @property
    def position_limit(self) -> int: ...
    @property
    def is_connected(self) -> bool: ...
    @property
    def is_closed(self) -> bool: ...


class PublicationLike(PublicationStream, Protocol):
    channel: str

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int: ...
    def close(self) -> None: ...


class ImageStream(Protocol):
    """What every image, and every media's image log, tells about its stream and how it reads."""

    session_id: int
    stream_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    join_position: int
    source_identity: str

    @property
    def is_end_of_stream(self) -> bool: ...
    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int: ...
    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int: ...
    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int: ...


class ImageLike(ImageStream, Protocol):
    @property
    def position(self) -> int: ...
    @property
    def is_closed(self) -> bool: ...


class SubscriptionLike(Protocol):
    channel: str
    stream_id: int

    @property
    def images(self) -> list[ImageLike]: ...
    @property
    def is_connected(self) -> bool: ...
    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int: ...
    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int: ...
    def close(self) -> None: ...

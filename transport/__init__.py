"""Aeron's UDP wire protocol and IPC in pure Python, plus recording and replay (archive).

Public API::

    from aeron_spark.transport import Driver, DriverConfig, Publication, Subscription, Image
    with Driver(DriverConfig()) as driver:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:40123", stream_id=10)
        pub = driver.add_publication("aeron:udp?endpoint=127.0.0.1:40123", stream_id=10)
        pub.wait_until_connected(5.0)
        pub.offer_blocking(b"hello", timeout_s=5.0)
        sub.wait(1.0); sub.poll(lambda payload, header: print(bytes(payload)), 10)
"""

from aeron_spark.transport.api import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    ControlledAction,
)
from aeron_spark.transport.counters import Counters, SystemCounters, read_counters
from aeron_spark.transport.driver.client import BufferClaim, Image, Publication, Subscription
from aeron_spark.transport.driver.driver import Driver, DriverConfig, default_directory
from aeron_spark.transport.errors import (
    BackPressuredError,
    ChannelError,
    ClosedError,
    DriverError,
    InvalidFrameError,
    LocalProtocolError,
    MaxPositionExceededError,
    NotConnectedError,
    OfferError,
    RemoteProtocolError,
    TransportError,
)
from aeron_spark.transport.protocol.term import FragmentAssembler, Header
from aeron_spark.transport.uri import ChannelConfig

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "BackPressuredError",
    "BufferClaim",
    "ChannelConfig",
    "ChannelError",
    "ClosedError",
    "ControlledAction",
    "Counters",
    "Driver",
    "DriverConfig",
    "DriverError",
    "FragmentAssembler",
    "Header",
    "Image",
    "InvalidFrameError",
    "LocalProtocolError",
    "MaxPositionExceededError",
    "NotConnectedError",
    "OfferError",
    "Publication",
    "RemoteProtocolError",
    "Subscription",
    "SystemCounters",
    "TransportError",
    "default_directory",
    "read_counters",
]

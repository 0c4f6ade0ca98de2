"""Aeron's UDP wire protocol and IPC in pure Python, plus recording and replay (archive)."""

from aeron_spark.transport.errors import (
    ChannelError,
    ClosedError,
    DriverError,
    InvalidFrameError,
    LocalProtocolError,
    RemoteProtocolError,
    TransportError,
)

__all__ = [
    "ChannelError",
    "ClosedError",
    "DriverError",
    "InvalidFrameError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "TransportError",
]

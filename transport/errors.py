"""Exception tree of the transport layer."""

from __future__ import annotations

from aeron_spark import errors as _root
from aeron_spark.errors import AeronSparkError, ConfigurationError


class TransportError(AeronSparkError):
    """Base class of transport errors."""


class ChannelError(ConfigurationError, TransportError):
    """A channel URI or one of its parameters is invalid."""


class LocalProtocolError(TransportError, _root.LocalProtocolError):
    """We were asked to do something the protocol does not allow (a bug or misuse on our side)."""


class RemoteProtocolError(TransportError, _root.RemoteProtocolError):
    """A peer sent bytes that are not valid Aeron protocol (malformed or out-of-range frame).

    Parse failures of received datagrams always surface as this error (or a subclass); the driver
    counts them as invalid frames and carries on.
    """


class InvalidFrameError(RemoteProtocolError):
    """A received frame could not be decoded."""


class ClosedError(TransportError):
    """The driver, publication or subscription has been closed."""


class DriverError(TransportError):
    """The media driver failed to set up a resource (socket, log buffer, thread)."""


class PortInUseError(DriverError):
    """A UDP port a server binds (``SO_REUSEPORT``, fixed) is held by another server of this
    host (network namespace), or being bound by one at this moment. ``host`` and ``port``
    name it."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"UDP port {port} (on {host}) is in use by another server (PORT_IN_USE): "
            "stop it or choose another --port"
        )
        self.host = host
        self.port = port


class DirectoryUnsafeError(DriverError):
    """The driver directory may be written by another user (DIRECTORY_UNSAFE): the default
    one (``/dev/shm/aeron-spark-<user>``, a name anyone can take first in the world-writable
    ``/dev/shm``) owned by another user, or any directory writable by every user. That user
    could replace IPC log files (its messages read as a stream's), delete them, or plant
    symlinks where the driver writes. ``path``, ``owner_uid`` and ``mode`` name it."""

    def __init__(self, path: str, owner_uid: int, mode: int, why: str) -> None:
        super().__init__(
            f"the driver directory {path} is not safe (DIRECTORY_UNSAFE): {why}; another user "
            "could replace its IPC log files or plant symlinks there. Remove it, or give the "
            "driver a directory of this user's own (DriverConfig(directory=...), AERON_SPARK_DIR)"
        )
        self.path = path
        self.owner_uid = owner_uid
        self.mode = mode


class OfferError(TransportError):
    """A blocking offer could not complete; ``reason`` names the last result code seen."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class NotConnectedError(OfferError):
    """No subscriber is connected to the publication (NOT_CONNECTED until the timeout)."""


class BackPressuredError(OfferError):
    """The publication stayed back-pressured (or in admin action) until the timeout."""


class MaxPositionExceededError(OfferError):
    """The publication has reached the largest position its term length allows."""


__all__ = [
    "BackPressuredError",
    "MaxPositionExceededError",
    "NotConnectedError",
    "OfferError",
    "PortInUseError",
    "ChannelError",
    "ClosedError",
    "DirectoryUnsafeError",
    "DriverError",
    "InvalidFrameError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "TransportError",
]

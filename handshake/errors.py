"""Exception tree of the handshake layer.

``HandshakeError`` is the root. Refusals the server sends carry a wire :class:`ErrorCode`; the
client raises the matching subclass of :class:`HandshakeRefusedError`, so callers can tell a full
server from a refused key without parsing text.
"""

from __future__ import annotations

import enum

from aeron_spark import errors as _root
from aeron_spark.errors import AeronSparkError


class ErrorCode(enum.IntEnum):
    """Codes of REFUSE messages (stable on the wire)."""

    MALFORMED = 1
    UNSUPPORTED_VERSION = 2
    SERVER_FULL = 3
    TOO_MANY_FROM_ADDRESS = 4
    TOO_MANY_PENDING = 5
    ADDRESS_DENIED = 6
    KEY_REFUSED = 7
    HANDSHAKE_TIMEOUT = 8
    SHUTTING_DOWN = 9
    ENCRYPTION_REQUIRED = 10
    CLIENT_UNKNOWN = 11
    TOO_MANY_FOR_KEY = 12


class HandshakeError(AeronSparkError):
    """Base class of handshake and session errors."""


class LocalProtocolError(HandshakeError, _root.LocalProtocolError):
    """We were asked to do something the protocol does not allow in this state (our bug/misuse)."""


class RemoteProtocolError(HandshakeError, _root.RemoteProtocolError):
    """The peer sent a message that is malformed, oversized, unexpected or fails authentication."""


class HandshakeRefusedError(HandshakeError):
    """The server refused the handshake; ``code`` is the wire code, ``detail`` its text."""

    code: ErrorCode = ErrorCode.MALFORMED

    def __init__(self, detail: str, endpoint: str = "") -> None:
        self.detail = detail
        self.endpoint = endpoint
        where = f" at {endpoint}" if endpoint else ""
        super().__init__(f"the server{where} refused the connection ({self.code.name}): {detail}")


class MalformedHandshakeError(HandshakeRefusedError):
    code = ErrorCode.MALFORMED


class UnsupportedVersionError(HandshakeRefusedError):
    code = ErrorCode.UNSUPPORTED_VERSION


class ServerFullError(HandshakeRefusedError):
    code = ErrorCode.SERVER_FULL


class TooManyConnectionsError(HandshakeRefusedError):
    """Too many connections from this address (its pending handshakes past
    ``max_pending_per_prefix``: :class:`TooManyPendingError`)."""

    code = ErrorCode.TOO_MANY_FROM_ADDRESS


class TooManyForKeyError(HandshakeRefusedError):
    """Too many sessions (connected or pending) of this client key: the server authorises client
    keys and bounds each key's share of its sessions (``max_per_key``)."""

    code = ErrorCode.TOO_MANY_FOR_KEY


class TooManyPendingError(HandshakeRefusedError):
    """Too many handshakes in flight (the server's ``max_pending``, or its
    ``max_pending_per_prefix`` for the client's /24 or /64): a moment's limit, retried."""

    code = ErrorCode.TOO_MANY_PENDING


class AddressDeniedError(HandshakeRefusedError):
    code = ErrorCode.ADDRESS_DENIED


class ShuttingDownError(HandshakeRefusedError):
    code = ErrorCode.SHUTTING_DOWN


class HandshakeTimeoutError(HandshakeRefusedError):
    """No answer (or no confirmation) within the handshake timeout (ours or the server's)."""

    code = ErrorCode.HANDSHAKE_TIMEOUT

    def __init__(self, detail: str, endpoint: str = "") -> None:
        super().__init__(detail, endpoint)
        where = f" with {endpoint}" if endpoint else ""
        self.args = (f"the handshake{where} did not complete (HANDSHAKE_TIMEOUT): {detail}",)


class KeyRefusedError(HandshakeRefusedError):
    """The server's public key is not the one we know (or pinned) for this endpoint."""

    code = ErrorCode.KEY_REFUSED


class EncryptionRequiredError(HandshakeRefusedError):
    """We asked for a sealed session and the server offered an unsealed one: refused by us."""

    code = ErrorCode.ENCRYPTION_REQUIRED

    def __init__(self, detail: str, endpoint: str = "") -> None:
        super().__init__(detail, endpoint)
        where = f" at {endpoint}" if endpoint else ""
        self.args = (f"refused the server{where} (ENCRYPTION_REQUIRED): {detail}",)


class ClientUnknownError(HandshakeRefusedError):
    """The server takes only listed client keys (``--authorized-keys``) and ours is not one:
    show it with ``aeron-spark keys show --client`` and have it added."""

    code = ErrorCode.CLIENT_UNKNOWN


class ConnectionClosedError(HandshakeError):
    """The connection is closed (by us, by the peer, or because the transport lost the peer)."""


class KeyStoreError(HandshakeError):
    """The key store on disk is unreadable, malformed or has unsafe permissions."""


class KeyStoreLockedError(KeyStoreError):
    """Another process held the key store's lock past the wait allowed (KEY_STORE_LOCKED)."""


REFUSALS: dict[ErrorCode, type[HandshakeRefusedError]] = {
    cls.code: cls
    for cls in (
        MalformedHandshakeError,
        UnsupportedVersionError,
        ServerFullError,
        TooManyConnectionsError,
        TooManyPendingError,
        AddressDeniedError,
        KeyRefusedError,
        HandshakeTimeoutError,
        ShuttingDownError,
        EncryptionRequiredError,
        ClientUnknownError,
        TooManyForKeyError,
    )
}


def refusal(code: int, detail: str, endpoint: str = "") -> HandshakeRefusedError:
    """The typed exception for a REFUSE message's code (unknown codes become MALFORMED)."""
    try:
        cls = REFUSALS[ErrorCode(code)]
    except ValueError:
        cls = MalformedHandshakeError
        detail = f"unknown refusal code {code}: {detail}"
    return cls(detail, endpoint)


__all__ = [
    "REFUSALS",
    "AddressDeniedError",
    "ClientUnknownError",
    "ConnectionClosedError",
    "EncryptionRequiredError",
    "ErrorCode",
    "HandshakeError",
    "HandshakeRefusedError",
    "HandshakeTimeoutError",
    "KeyRefusedError",
    "KeyStoreError",
    "KeyStoreLockedError",
    "LocalProtocolError",
    "MalformedHandshakeError",
    "RemoteProtocolError",
    "ServerFullError",
    "ShuttingDownError",
    "TooManyConnectionsError",
    "TooManyForKeyError",
    "TooManyPendingError",
    "UnsupportedVersionError",
    "refusal",
]

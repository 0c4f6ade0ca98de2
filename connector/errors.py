"""Exception tree of the connector and the stream server's control protocol.

Every error the server reports travels as ``{"code": int, "message": str, "details": dict}``;
the client turns it back into the class below with the same :class:`ErrorCode`, so a caller on
the other side of the wire catches exactly the class the server raised. ``details`` carries
structured fields (for :class:`NotFrameBoundaryError` the nearest valid positions, for
:class:`PurgedError` the first readable position) and is exposed as attributes of the exception.

Split as h2 does: :class:`ControlProtocolError` is "the peer sent something that is not valid
protocol"; every other class is a well-formed request the server refused.
"""

from __future__ import annotations

import enum
from typing import Any

from aeron_spark import errors as _root
from aeron_spark.errors import DetailedError
from aeron_spark.transport.archive import errors as archive


class ErrorCode(enum.IntEnum):
    """Wire codes of control-protocol errors (stable: clients and servers of different versions
    must agree on them)."""

    INTERNAL = 1
    CONTROL_PROTOCOL = 2
    NOT_AUTHORISED = 3
    UNKNOWN_STREAM = 4
    UNKNOWN_RECORDING = 5
    POSITION_OUT_OF_RANGE = 6
    NOT_FRAME_BOUNDARY = 7
    PURGED = 8
    SERVER_UNAVAILABLE = 9
    STAGED_DATA_MISSING = 10
    PAYLOAD_TOO_LARGE = 11
    CHUNK_MISSING = 12
    LIMIT_EXCEEDED = 13
    STORAGE_FULL = 14
    TOO_MANY_OPEN_FILES = 15
    NOT_ENOUGH_REPLICAS = 16


class ConnectorError(DetailedError):
    """Base class of connector errors. ``code`` is the wire code; ``details`` structured fields."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across Spark's Python workers
        return (_rebuild, (type(self), self.message, self.details))

    def to_wire(self) -> dict[str, Any]:
        return {"code": int(self.code), "message": self.message, "details": dict(self.details)}


def _rebuild(cls: type[ConnectorError], message: str, details: dict[str, Any]) -> ConnectorError:
    return cls(message, **details)


class ServerError(ConnectorError):
    """The server failed while handling a valid request (a bug or an I/O failure on its side)."""

    code = ErrorCode.INTERNAL


class ServerUnavailableError(ConnectorError):
    """The server cannot be reached, went away mid-request, or did not answer in time."""

    code = ErrorCode.SERVER_UNAVAILABLE


class SessionLostError(ServerUnavailableError):
    """This client's session went away (the server was killed or restarted, or the network
    between them failed): raised on the client side only, never sent on the wire. A
    :class:`~aeron_spark.connector.client.StreamClient` catches it and reconnects while its
    ``timeout_s`` allows; a refused handshake or an unanswered request is not a lost session."""


class DirectoryInUseError(ServerUnavailableError):
    """A server cannot start: another server holds its data directory's lock. Raised at start
    only, never sent on the wire. ``details``: ``directory``, ``pid`` (the holder, or None when
    it cannot be read) and ``lock_file``."""


class DirectoryUnsafeError(ServerUnavailableError):
    """A server cannot start: another user could write into its data directory (it is owned
    by another user, or writable by others), and so plant symlinks where the server writes
    (its lock, ``stat.json``) or replace its recordings. Raised at start only, never sent on
    the wire. ``details``: ``directory``, ``owner_uid``, ``mode``."""


class PortInUseError(ServerUnavailableError):
    """A server cannot start: another server of this host holds (or is binding at this very
    moment) one of its UDP ports. Raised at start only, never sent on the wire. ``details``:
    ``host``, ``port``."""


class CommitLogCorruptError(ServerError):
    """A server cannot start: its sink commit log holds a record that does not read (a damaged
    disk block) with whole records after it. Not a crash's torn tail (only the last record can
    be torn): cutting the log there would forget every acknowledged commit after it, so the
    log is left as it is for the operator. Raised at start only, never sent on the wire.
    ``details``: ``path``, ``offset`` (the bad record's first byte), ``size``."""


class ReplicasUnavailableError(ServerUnavailableError):
    """No archive of a set of replicas could serve a request (``archive`` naming several
    control channels): none reachable, or none holding the recording up to the position
    wanted. Raised on the reader's side only. ``details``: ``archives``, each archive's control
    channel with why it could not serve (its error's code and message), in preference order."""


class UnknownStreamError(ConnectorError):
    """No recording exists (or is allowed) for the stream id."""

    code = ErrorCode.UNKNOWN_STREAM


# The archive's four errors travel as these: each is the archive's class (``except
# archive.PurgedError`` catches it) with a wire code, so there is one class per meaning.


class UnknownRecordingError(ConnectorError, archive.UnknownRecordingError):
    __doc__ = archive.UnknownRecordingError.__doc__
    code = ErrorCode.UNKNOWN_RECORDING


class PositionOutOfRangeError(ConnectorError, archive.PositionOutOfRangeError):
    """A position lies outside ``[purged_position, recorded_position]`` of the recording, or a
    range is reversed. ``details``: ``position``, ``start_position``, ``end_position``."""

    code = ErrorCode.POSITION_OUT_OF_RANGE


class NotFrameBoundaryError(PositionOutOfRangeError, archive.NotFrameBoundaryError):
    """A replay start or end falls inside a frame. ``details``: ``position``, ``before`` and
    ``after`` (the nearest frame boundaries around it)."""

    code = ErrorCode.NOT_FRAME_BOUNDARY


class PurgedError(ConnectorError, archive.PurgedError):
    """The requested range was purged by retention. ``details``: ``position`` (asked for) and
    ``purged_position`` (first readable position). Spark's failOnDataLoss is built on this."""

    code = ErrorCode.PURGED


class NotAuthorisedError(ConnectorError):
    """The session may not perform this operation (server policy, or another session's object)."""

    code = ErrorCode.NOT_AUTHORISED


class ControlProtocolError(ConnectorError, _root.RemoteProtocolError):
    """A control message was malformed, oversized, of an unknown operation or with bad arguments."""

    code = ErrorCode.CONTROL_PROTOCOL


class ChunkMissingError(ControlProtocolError):
    """A chunked message could not be reassembled: a chunk is missing, out of order, or expired.
    ``details``: ``payload_id``, ``expected_index``, ``got_index``."""

    code = ErrorCode.CHUNK_MISSING


class PayloadTooLargeError(ControlProtocolError):
    """A message or payload exceeds a limit. ``details``: ``length``, ``limit``."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class LimitExceededError(ConnectorError):
    """A server resource limit (replays per session, staged bytes, ...) is reached.
    ``details``: ``limit``."""

    code = ErrorCode.LIMIT_EXCEEDED


class StorageFullError(ConnectorError):
    """The server could not store what was asked (publish, stage, commit): its directory's file
    system is full (ENOSPC/EDQUOT), below the ``--min-free-bytes`` watermark, or failing (EIO).
    Nothing of the request was acknowledged; positions stay where they were, so the same request
    can be sent again once space is freed. ``details``: ``directory``, ``free_bytes``,
    ``min_free_bytes``, ``reason`` (the errno name, or ``WATERMARK``)."""

    code = ErrorCode.STORAGE_FULL


class TooManyOpenFilesError(ConnectorError):
    """The server ran out of file descriptors (EMFILE/ENFILE) for this request; the request
    failed, the server and every other session go on. ``details``: ``soft_limit``,
    ``hard_limit``, ``open_files``."""

    code = ErrorCode.TOO_MANY_OPEN_FILES


class StagedDataMissingError(ConnectorError):
    """A commit names a staged part the server no longer has (never staged, aborted, or garbage
    collected after its lease ran out). ``details``: ``part``."""

    code = ErrorCode.STAGED_DATA_MISSING


class NotEnoughReplicasError(ConnectorError):
    """A sink commit could not be acknowledged: fewer archives than ``minInSyncReplicas`` (the
    primary counts as one, Kafka's meaning) hold the batch's END marker. Nothing of the batch is
    acknowledged and a committed-only reader does not see it (the primary's append was undone,
    or never made); the commit can be repeated once replicas are back. ``details``:
    ``required`` (minInSyncReplicas), ``in_sync`` (archives that held it, the primary
    included), ``failed`` (each replica that did not, by control channel: why)."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


_BY_CODE: dict[int, type[ConnectorError]] = {
    int(cls.code): cls
    for cls in (
        ServerError,
        ServerUnavailableError,
        UnknownStreamError,
        UnknownRecordingError,
        PositionOutOfRangeError,
        NotFrameBoundaryError,
        PurgedError,
        NotAuthorisedError,
        ControlProtocolError,
        ChunkMissingError,
        PayloadTooLargeError,
        LimitExceededError,
        StagedDataMissingError,
        StorageFullError,
        TooManyOpenFilesError,
        NotEnoughReplicasError,
    )
}


def error_from_wire(error: object) -> ConnectorError:
    """Rebuild the typed exception from an error map received from the peer.

    A map that is not of the expected shape becomes a :class:`ControlProtocolError` (never a
    crash): the peer broke the protocol.
    """
    if not isinstance(error, dict):
        return ControlProtocolError(f"malformed error reply: {error!r:.200}")
    code = error.get("code")
    message = error.get("message")
    details = error.get("details", {})
    if not isinstance(code, int) or not isinstance(message, str) or not isinstance(details, dict):
        return ControlProtocolError(f"malformed error reply: {error!r:.200}")
    cls = _BY_CODE.get(code, ServerError)
    safe = {
        k: v
        for k, v in details.items()
        if isinstance(k, str) and k.isidentifier() and k != "message"
    }
    return cls(message, **safe)


__all__ = [
    "ChunkMissingError",
    "CommitLogCorruptError",
    "ConnectorError",
    "ControlProtocolError",
    "DirectoryInUseError",
    "DirectoryUnsafeError",
    "PortInUseError",
    "ErrorCode",
    "LimitExceededError",
    "NotAuthorisedError",
    "NotEnoughReplicasError",
    "NotFrameBoundaryError",
    "PayloadTooLargeError",
    "PositionOutOfRangeError",
    "PurgedError",
    "ReplicasUnavailableError",
    "ServerError",
    "ServerUnavailableError",
    "SessionLostError",
    "StagedDataMissingError",
    "StorageFullError",
    "TooManyOpenFilesError",
    "UnknownRecordingError",
    "UnknownStreamError",
    "error_from_wire",
]


_FROM_ARCHIVE: dict[int, type[ConnectorError]] = {
    int(archive.ArchiveErrorCode.UNKNOWN_RECORDING): UnknownRecordingError,
    int(archive.ArchiveErrorCode.POSITION_OUT_OF_RANGE): PositionOutOfRangeError,
    int(archive.ArchiveErrorCode.NOT_FRAME_BOUNDARY): NotFrameBoundaryError,
    int(archive.ArchiveErrorCode.PURGED): PurgedError,
}


def from_archive(exc: archive.ArchiveError) -> ConnectorError:
    """The wire error for an archive error, chosen by its code (same message and details).

    A connector error that is also an archive error (the four above) is already the wire's own.
    """
    if isinstance(exc, ConnectorError):
        return exc
    cls = _FROM_ARCHIVE.get(int(exc.code), ServerError)
    return cls(exc.message, **exc.details)

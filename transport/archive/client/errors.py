"""Errors of the Aeron Archive client (one tree, under :class:`~..errors.ArchiveError`).

* :class:`ArchiveResponseError`: the archive answered a request with an error. ``error_code`` is
  the archive's own code (:class:`ArchiveErrorCode`, the numbers of Aeron's ``ArchiveException``),
  ``error_message`` its text, ``correlation_id`` the request's. Codes with a meaning of their own
  have a subclass (an unknown recording is also the project's
  :class:`~aeron_spark.transport.archive.errors.UnknownRecordingError`).
* :class:`ArchiveChallengeError`: the archive challenged our connect and we have no way to answer
  (no credentials, or credentials without a challenge handler).
* :class:`ArchiveAuthenticationError`: the archive refused our credentials
  (``AUTHENTICATION_REJECTED``) or the action (``UNAUTHORISED_ACTION``); never quotes them.
* :class:`ArchiveReplicationError`: a replication ended without reaching what was waited for.
* :class:`ArchiveVersionError`: the archive speaks another major version of the protocol.
* :class:`ArchiveTimeoutError`: no answer (or no replay progress) within the deadline: the
  archive is gone, stalled or unreachable.
* :class:`ArchiveSessionClosedError`: the control session is closed (by us, or the archive's
  response stream went away).
* :class:`ArchiveProtocolError`: the archive sent bytes that are not a message we understand.
"""

from __future__ import annotations

import enum
from typing import Any

from aeron_spark.transport.archive.errors import ArchiveError, UnknownRecordingError


class ArchiveErrorCode(enum.IntEnum):
    """The archive's error codes (``relevantId`` of an ERROR control response)."""

    GENERIC = 0
    ACTIVE_LISTING = 1
    ACTIVE_RECORDING = 2
    ACTIVE_SUBSCRIPTION = 3
    UNKNOWN_SUBSCRIPTION = 4
    UNKNOWN_RECORDING = 5
    UNKNOWN_REPLAY = 6
    MAX_REPLAYS = 7
    MAX_RECORDINGS = 8
    INVALID_EXTENSION = 9
    AUTHENTICATION_REJECTED = 10
    STORAGE_SPACE = 11
    UNKNOWN_REPLICATION = 12
    UNAUTHORISED_ACTION = 13
    REPLICATION_CONNECTION_FAILURE = 14


class ArchiveClientError(ArchiveError):
    """Base class of the archive client's errors."""

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across Spark's Python workers
        return (_rebuild, (type(self), self.message, self.details))


def _rebuild(cls: type[ArchiveClientError], message: str, details: dict[str, Any]) -> Any:
    return cls(message, **details)


class ArchiveResponseError(ArchiveClientError):
    """The archive refused a request. ``details``: ``error_code`` (int, see
    :class:`ArchiveErrorCode`), ``error_message``, ``correlation_id``, ``request``."""

    @property
    def archive_code(self) -> ArchiveErrorCode | int:
        """The archive's own error code (``code`` stays the project's archive-layer code)."""
        raw = int(self.details.get("error_code", 0))
        try:
            return ArchiveErrorCode(raw)
        except ValueError:
            return raw


class ArchiveUnknownRecordingError(ArchiveResponseError, UnknownRecordingError):
    """The archive has no recording with that id."""


class ArchiveActiveRecordingError(ArchiveResponseError):
    """The recording is active (still recording) and the operation needs a stopped one."""


class ArchiveUnknownSubscriptionError(ArchiveResponseError):
    """No recording subscription matches."""


class ArchiveUnknownReplayError(ArchiveResponseError):
    """No replay session with that id."""


class ArchiveLimitError(ArchiveResponseError):
    """The archive reached a limit (concurrent replays, recordings, storage space)."""


class ArchiveAuthenticationError(ArchiveResponseError):
    """The archive rejected our credentials or the action."""


class ArchiveUnknownReplicationError(ArchiveResponseError):
    """No replication with that id (never started, or over: it ended or was stopped)."""


_BY_CODE: dict[int, type[ArchiveResponseError]] = {
    ArchiveErrorCode.ACTIVE_RECORDING: ArchiveActiveRecordingError,
    ArchiveErrorCode.UNKNOWN_SUBSCRIPTION: ArchiveUnknownSubscriptionError,
    ArchiveErrorCode.UNKNOWN_RECORDING: ArchiveUnknownRecordingError,
    ArchiveErrorCode.UNKNOWN_REPLAY: ArchiveUnknownReplayError,
    ArchiveErrorCode.MAX_REPLAYS: ArchiveLimitError,
    ArchiveErrorCode.MAX_RECORDINGS: ArchiveLimitError,
    ArchiveErrorCode.STORAGE_SPACE: ArchiveLimitError,
    ArchiveErrorCode.AUTHENTICATION_REJECTED: ArchiveAuthenticationError,
    ArchiveErrorCode.UNAUTHORISED_ACTION: ArchiveAuthenticationError,
    ArchiveErrorCode.UNKNOWN_REPLICATION: ArchiveUnknownReplicationError,
}


def response_error(
    request: str, error_code: int, error_message: str, correlation_id: int
) -> ArchiveResponseError:
    """The typed exception for an archive's ERROR response to ``request``."""
    cls = _BY_CODE.get(error_code, ArchiveResponseError)
    try:
        name = ArchiveErrorCode(error_code).name
    except ValueError:
        name = f"code {error_code}"
    return cls(
        f"the archive refused {request} ({name}): {error_message}",
        error_code=error_code,
        error_message=error_message,
        correlation_id=correlation_id,
        request=request,
    )


class ArchiveChallengeError(ArchiveClientError):
    """The archive answered the connect request with an authentication challenge that this
    client cannot answer (no credentials with a challenge handler were given)."""


class ArchiveVersionError(ArchiveClientError):
    """The archive speaks a protocol major version other than ours."""


class ArchiveTimeoutError(ArchiveClientError):
    """No response, or no replay progress, within the deadline (``details['timeout_ms']``)."""


class ArchiveSessionClosedError(ArchiveClientError):
    """The control session is closed, or the archive's responses stopped (its image went)."""


class ArchiveReplayError(ArchiveClientError):
    """A replay ended (its image went) before the end of its range: the range is no longer
    all in the recording (truncated or purged meanwhile), or the archive stopped it."""


class ArchiveReplicationError(ArchiveClientError):
    """A replication ended (``REPLICATE_END``) without reaching what the caller waited for
    (``details``: ``replication_id``, ``signals`` seen). A replication the archive failed is an
    :class:`ArchiveResponseError` with the archive's code instead."""


class ArchiveProtocolError(ArchiveClientError):
    """A message from the archive that we cannot decode or that breaks the protocol."""


__all__ = [
    "ArchiveActiveRecordingError",
    "ArchiveAuthenticationError",
    "ArchiveChallengeError",
    "ArchiveClientError",
    "ArchiveErrorCode",
    "ArchiveLimitError",
    "ArchiveProtocolError",
    "ArchiveReplayError",
    "ArchiveReplicationError",
    "ArchiveResponseError",
    "ArchiveSessionClosedError",
    "ArchiveTimeoutError",
    "ArchiveUnknownRecordingError",
    "ArchiveUnknownReplayError",
    "ArchiveUnknownReplicationError",
    "ArchiveUnknownSubscriptionError",
    "ArchiveVersionError",
    "response_error",
]

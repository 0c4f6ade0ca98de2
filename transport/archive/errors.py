"""Errors of the archive (recording and replay by position).

Each carries structured ``details`` (for :class:`NotFrameBoundaryError` the nearest valid
positions, for :class:`PurgedError` the first readable position), exposed as attributes. The
stream server turns them into its wire errors of the same names.
"""

from __future__ import annotations

from aeron_spark.transport.errors import TransportError

from aeron_spark.errors import DetailedError


class ArchiveError(TransportError, DetailedError):
    """Base class of archive errors: a message and structured details."""


class UnknownRecordingError(ArchiveError):
    """No recording with that id."""


class PositionOutOfRangeError(ArchiveError):
    """A position outside ``[start, recorded end]`` of the recording."""


class NotFrameBoundaryError(ArchiveError):
    """A position inside a frame; ``details`` name the nearest valid positions."""


class PurgedError(ArchiveError):
    """The position was purged; ``details['purged_position']`` is the first readable one."""


__all__ = [
    "ArchiveError",
    "NotFrameBoundaryError",
    "PositionOutOfRangeError",
    "PurgedError",
    "UnknownRecordingError",
]

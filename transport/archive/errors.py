"""Errors of the archive (recording and replay by position).

Each carries a :class:`ArchiveErrorCode` (``code``) and structured ``details`` (for
:class:`NotFrameBoundaryError` the nearest valid positions, for :class:`PurgedError` the first
readable position), exposed as attributes. The stream server maps the code (never the class name)
to its wire error, which is a subclass of the archive error of the same meaning.
"""

from __future__ import annotations

import enum

from aeron_spark.errors import DetailedError
from aeron_spark.transport.errors import TransportError


class ArchiveErrorCode(enum.IntEnum):
    """What went wrong, as a number a higher layer can map (``UNKNOWN_RECORDING`` is Aeron's
    ``ArchiveException.UNKNOWN_RECORDING``; Aeron has no code for the others)."""

    GENERIC = 0
    UNKNOWN_RECORDING = 5
    POSITION_OUT_OF_RANGE = 101
    NOT_FRAME_BOUNDARY = 102
    PURGED = 103
    ID_MARK_CORRUPT = 104
    NOT_REGULAR_FILE = 105


class ArchiveError(TransportError, DetailedError):
    """Base class of archive errors: a code, a message and structured details."""

    code: enum.IntEnum = ArchiveErrorCode.GENERIC


class UnknownRecordingError(ArchiveError):
    """No recording with that id."""

    code: enum.IntEnum = ArchiveErrorCode.UNKNOWN_RECORDING


class PositionOutOfRangeError(ArchiveError):
    """A position outside ``[start, recorded end]`` of the recording."""

    code: enum.IntEnum = ArchiveErrorCode.POSITION_OUT_OF_RANGE


class NotFrameBoundaryError(ArchiveError):
    """A position inside a frame; ``details`` name the nearest valid positions."""

    code: enum.IntEnum = ArchiveErrorCode.NOT_FRAME_BOUNDARY


class PurgedError(ArchiveError):
    """The position was purged; ``details['purged_position']`` is the first readable one."""

    code: enum.IntEnum = ArchiveErrorCode.PURGED


class IdMarkCorruptError(ArchiveError, ValueError):
    """A store cannot open: its durable high-water mark of issued recording ids
    (``recordings/next_id.msgpack``, written whole and renamed in, so only a damaged disk or a
    hand's edit spoils it) does not read. Starting without it could issue an id again (another
    recording's consumer positions and sink commits would apply to the new one), so the store
    refuses and the operator writes a value past every id ever issued. ``details``: ``path``."""

    code: enum.IntEnum = ArchiveErrorCode.ID_MARK_CORRUPT


class NotRegularFileError(ArchiveError, OSError):
    """A file the server reads from its data directory (a recording's descriptor, the id mark,
    the consumers' positions, the sink commit log) is not a regular file: a FIFO, a device, a
    socket or a symbolic link (never followed). Opened non-blocking, so a FIFO is refused at
    once where an ordinary ``open`` waited for a writer for good. An ``OSError`` too, so a
    caller that treats an unreadable file as damaged (a recording's descriptor) does so.
    ``details``: ``path``, ``mode`` (octal text of ``st_mode``)."""

    code: enum.IntEnum = ArchiveErrorCode.NOT_REGULAR_FILE

    def __str__(self) -> str:  # OSError's would print its (absent) errno, not the message
        return self.message


__all__ = [
    "ArchiveError",
    "ArchiveErrorCode",
    "IdMarkCorruptError",
    "NotRegularFileError",
    "NotFrameBoundaryError",
    "PositionOutOfRangeError",
    "PurgedError",
    "UnknownRecordingError",
]

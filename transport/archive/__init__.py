"""Recording and replay of streams by position (the job of Aeron's Archive).

:class:`RecordingStore` keeps recordings on disk (segment files, a position/time index, purge,
crash recovery cutting a torn tail); :class:`Recorder` records a subscription's images into it;
``Recording.read(position, max_bytes, limit)`` replays raw frames from any frame boundary, and
``position_at(timestamp_ns)`` finds the first message at or after a time.
"""

from aeron_spark.transport.archive.errors import (
    ArchiveError,
    NotFrameBoundaryError,
    PositionOutOfRangeError,
    PurgedError,
    UnknownRecordingError,
)
from aeron_spark.transport.archive.recorder import Recorder
from aeron_spark.transport.archive.recordings import Descriptor, Recording, RecordingStore

__all__ = [
    "ArchiveError",
    "Descriptor",
    "NotFrameBoundaryError",
    "PositionOutOfRangeError",
    "PurgedError",
    "Recorder",
    "Recording",
    "RecordingStore",
    "UnknownRecordingError",
]

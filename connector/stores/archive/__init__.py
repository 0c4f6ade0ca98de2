"""An Aeron Archive as a log store: reading its recordings (:mod:`.source`) and the
exactly-once sink into a target recording (:mod:`.sink`)."""

from aeron_spark.connector.stores.archive.source import (
    ArchiveRange,
    ArchiveSession,
    ArchiveStore,
    connect,
    owned,
    replay_bounds,
    served,
    split_range,
)

__all__ = [
    "ArchiveRange",
    "ArchiveSession",
    "ArchiveStore",
    "connect",
    "owned",
    "replay_bounds",
    "served",
    "split_range",
]

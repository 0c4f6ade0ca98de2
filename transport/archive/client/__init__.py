"""A client of the real Aeron Archive (its control protocol), over the project's transport.

:class:`ArchiveClient` (I/O) wraps :class:`ControlSession` (sans-I/O: requests, responses by
correlation id, listings, recording signals, keep-alive and time-out deadlines driven by
``now_ns``). Messages are encoded by the project's SBE engine from ``control.xml``. Errors are
:class:`ArchiveClientError` and below (``errors``).
"""

from aeron_spark.transport.archive.client import errors
from aeron_spark.transport.archive.client.client import (
    ArchiveClient,
    ArchiveClientConfig,
    ReplayedBlock,
    ReplicationParams,
    patch_frames,
    process_driver,
)
from aeron_spark.transport.archive.client.credentials import ArchiveCredentials
from aeron_spark.transport.archive.client.errors import *  # noqa: F403 - its __all__, below
from aeron_spark.transport.archive.client.session import (
    ControlConfig,
    ControlSession,
    RecordingDescriptor,
    RecordingSignal,
    ReplicationStatus,
    SessionState,
    SignalEvent,
)

# the package's names: its own, then every name of ``errors`` (listed once, there)
__all__ = [
    "ArchiveClient",
    "ArchiveClientConfig",
    "ArchiveCredentials",
    "ControlConfig",
    "ControlSession",
    "RecordingDescriptor",
    "RecordingSignal",
    "ReplayedBlock",
    "ReplicationParams",
    "ReplicationStatus",
    "SessionState",
    "SignalEvent",
    "patch_frames",
    "process_driver",
]
__all__ += errors.__all__

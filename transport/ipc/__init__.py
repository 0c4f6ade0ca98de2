"""``aeron:ipc``: publications and subscriptions in different processes on one host, through
memory-mapped log buffer files in the driver directory (see :mod:`.logfile` for the layout).

The driver calls :func:`add_publication` / :func:`add_subscription` for ``aeron:ipc`` channels
and steps the returned objects' ``do_work(now_ns)`` from its conductor; applications use them
through ``Driver.add_publication("aeron:ipc?term-length=...", stream_id)`` like UDP ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aeron_spark.transport.ipc.logfile import LogFile
from aeron_spark.transport.ipc.publication import IpcPublication
from aeron_spark.transport.ipc.subscription import IpcImage, IpcSubscription
from aeron_spark.transport.ipc.watch import DirectoryWatch, open_watch
from aeron_spark.transport.uri import ChannelConfig

DEFAULT_LIVENESS_TIMEOUT_NS = 10_000_000_000


def add_publication(
    config: ChannelConfig,
    stream_id: int,
    *,
    directory: Path,
    exclusive: bool = True,
    liveness_timeout_ns: int = DEFAULT_LIVENESS_TIMEOUT_NS,
) -> IpcPublication:
    return IpcPublication(
        config, stream_id, directory, exclusive=exclusive, liveness_timeout_ns=liveness_timeout_ns
    )


def add_subscription(
    config: ChannelConfig,
    stream_id: int,
    *,
    directory: Path,
    on_available_image: Callable[[Any], object] | None = None,
    on_unavailable_image: Callable[[Any], object] | None = None,
    liveness_timeout_ns: int = DEFAULT_LIVENESS_TIMEOUT_NS,
    watch: DirectoryWatch | None = None,
) -> IpcSubscription:
    return IpcSubscription(
        config,
        stream_id,
        directory,
        on_available_image=on_available_image,
        on_unavailable_image=on_unavailable_image,
        liveness_timeout_ns=liveness_timeout_ns,
        watch=watch,
    )


__all__ = [
    "DEFAULT_LIVENESS_TIMEOUT_NS",
    "DirectoryWatch",
    "IpcImage",
    "IpcPublication",
    "IpcSubscription",
    "LogFile",
    "open_watch",
    "add_publication",
    "add_subscription",
]

"""The server's two finite resources: disk space under its directory and file descriptors.

- :class:`SpaceGuard` refuses new appends (publish, stage, commit, ingest) while the file
  system of the server's directory has less than ``min_free_bytes`` free, before it is full,
  and turns the ``OSError`` of a write that failed anyway (ENOSPC, EDQUOT, EIO) into a coded
  :class:`~aeron_spark.connector.errors.StorageFullError` naming the directory and its free
  space.
- :func:`raise_nofile_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard limit at start; an
  EMFILE/ENFILE becomes a coded
  :class:`~aeron_spark.connector.errors.TooManyOpenFilesError` for that one request.
"""

from __future__ import annotations

import errno
import os
import resource
from typing import Any

from aeron_spark.connector.errors import (
    ConnectorError,
    StorageFullError,
    TooManyOpenFilesError,
)

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
_UNLIMITED_CAP = 1 << 20  # the soft limit asked for when the hard limit is unlimited


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s file system (-1 unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


class SpaceGuard:
    """Free space checks of one directory (thread-safe enough: counters are advisory)."""

    def __init__(self, directory: str, min_free_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        self.min_free_bytes = min_free_bytes
        self.refused = 0  # requests refused by the watermark
        self.failed = 0  # writes that failed with ENOSPC/EDQUOT/EIO/EROFS

    def free_bytes(self) -> int:
        return free_bytes(self.directory)

    def check(self, what: str) -> None:
        """Raise :class:`StorageFullError` when the free space is below the watermark."""
        if self.min_free_bytes <= 0:
            return
        free = self.free_bytes()
        if 0 <= free < self.min_free_bytes:
            self.refused += 1
            raise StorageFullError(
                f"{what} refused: {self.directory} has {free:,} bytes free, below the "
                f"server's --min-free-bytes {self.min_free_bytes:,}; free space there (or purge) "
                "and send it again",
                directory=self.directory,
                free_bytes=free,
                min_free_bytes=self.min_free_bytes,
                reason="WATERMARK",
            )

    def below_watermark(self) -> bool:
        if self.min_free_bytes <= 0:
            return False
        free = self.free_bytes()
        return 0 <= free < self.min_free_bytes

    def error_for(self, exc: OSError, what: str) -> ConnectorError | None:
        """The coded error of an ``OSError`` from a request, or None (not a resource error)."""
        if exc.errno in STORAGE_ERRNOS:
            self.failed += 1
            free = self.free_bytes()
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return StorageFullError(
                f"{what} failed: cannot write under {self.directory} ({name}: "
                f"{exc.strerror}; {free:,} bytes free); nothing of it was acknowledged, send it "
                "again once there is space",
                directory=self.directory,
                free_bytes=free,
                min_free_bytes=self.min_free_bytes,
                reason=name,
            )
        if exc.errno in DESCRIPTOR_ERRNOS:
            soft, hard = nofile_limits()
            return TooManyOpenFilesError(
                f"{what} failed: the server has no file descriptor left ({open_fd_count()} open, "
                f"limit {soft}, hard limit {hard}); nothing of it was acknowledged",
                soft_limit=soft,
                hard_limit=hard,
                open_files=open_fd_count(),
            )
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "free_bytes": self.free_bytes(),
            "min_free_bytes": self.min_free_bytes,
            "below_watermark": self.below_watermark(),
            "refused_by_watermark": self.refused,
            "write_failures": self.failed,
        }


def _limit(value: int) -> int:
    return -1 if value == resource.RLIM_INFINITY else int(value)


def nofile_limits() -> tuple[int, int]:
    """``(soft, hard)`` RLIMIT_NOFILE of this process (-1: unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _limit(soft), _limit(hard)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as far as the kernel allows); the
    limits after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, _UNLIMITED_CAP)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # e.g. above fs.nr_open: keep what we have
            pass
    return nofile_limits()


def open_fd_count() -> int:
    """Descriptors this process has open (-1 when it cannot tell, e.g. under EMFILE itself)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir used
    except OSError:
        return -1


def file_cache_capacity(soft_limit: int) -> int:
    """How many recording files the server keeps open: a third of the descriptor limit
    (the rest is for sessions, staging and the transport), between 16 and 16384. Each
    publishing session's recording keeps three (its segment, its index and its acked end):
    at 1024 open files 1024 sessions publishing in turn opened and closed them at every
    publish (issue 31), and with a quarter of a 20,000 limit 2,048 sessions still did (6,144
    files through a cache of 5,000 taken in turn: every one a miss)."""
    if soft_limit < 0:
        return 1024
    return max(16, min(16384, soft_limit // 3))


#: Descriptors the server holds besides recording files and dedicated sockets: ~15 at start
#: (its log, lock, transport sockets, epoll, inotify, IPC logs, the sink's commit log), its
#: sessions' shared sockets, and the files a stat snapshot, a consumers' commit or a replay
#: opens for a moment (23 measured at 48 idle sessions; taken twice)
SERVER_BASE_DESCRIPTORS = 48


def spare_open_budget(soft_limit: int, cache: int) -> int:
    """Descriptors the spare recording directories may hold open: the file cache's budget
    where the limit leaves room for it beside the cache, an eighth for dedicated sockets and
    ``SERVER_BASE_DESCRIPTORS``; less (none) under a low limit. Before, the spares took the
    cache's budget again whatever the limit: at a limit of 48, 16 cached files, 16 spares'
    and the server's own 23 left none, and publishes failed with ``TOO_MANY_OPEN_FILES``."""
    if soft_limit < 0:
        return cache
    return max(0, min(cache, soft_limit - cache - soft_limit // 8 - SERVER_BASE_DESCRIPTORS))


__all__ = [
    "DESCRIPTOR_ERRNOS",
    "SERVER_BASE_DESCRIPTORS",
    "STORAGE_ERRNOS",
    "SpaceGuard",
    "file_cache_capacity",
    "free_bytes",
    "nofile_limits",
    "open_fd_count",
    "raise_nofile_limit",
    "spare_open_budget",
]

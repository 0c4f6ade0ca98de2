"""Writes that survive short writes: ``pwrite`` continued until every byte is down."""

from __future__ import annotations

import errno
import os


def pwrite_all(fd: int, data: memoryview | bytes, offset: int, path: str) -> int:
    """``pwrite`` all of ``data`` at ``offset``, continuing after short writes (a filesystem
    may write less than asked without an error). Raises ``OSError`` (ENOSPC when a write makes
    no progress); returns ``-short_writes`` (0 when the first write took everything)."""
    view = memoryview(data)
    done = short = 0
    while done < len(view):
        count = os.pwrite(fd, view[done:], offset + done)
        if count <= 0:
            raise OSError(errno.ENOSPC, "write made no progress (file system full?)", path)
        done += count
        if done < len(view):
            short += 1
    return -short

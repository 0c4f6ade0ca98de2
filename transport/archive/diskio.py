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


#: The most buffers one ``os.pwritev`` takes (``IOV_MAX``; Linux's is 1024).
IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024) or 1024


class Gathered:
    """Buffers that are one block when written in order (``os.pwritev``): a block of frames
    holding a large payload as it is (its fragments' headers beside slices of it), not copied
    into one buffer first. ``len()`` is the block's length in bytes."""

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: list[bytes | bytearray | memoryview], nbytes: int) -> None:
        self.parts = parts
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes

    def tobytes(self) -> bytes:
        """The block's bytes joined (a copy: for tests and small blocks)."""
        return b"".join(self.parts)


def pwritev_all(fd: int, buffers: list[memoryview], offset: int, path: str) -> int:
    """``os.pwritev`` all of ``buffers`` (at most :data:`IOV_MAX`) at ``offset`` in order,
    continuing after short writes as :func:`pwrite_all` does (same errors, same result)."""
    views = buffers
    first = short = 0
    while first < len(views):
        count = os.pwritev(fd, views[first:] if first else views, offset)
        if count <= 0:
            raise OSError(errno.ENOSPC, "write made no progress (file system full?)", path)
        offset += count
        while first < len(views) and count >= len(views[first]):
            count -= len(views[first])
            first += 1
        if first < len(views):
            if count:
                if views is buffers:
                    views = list(buffers)  # the caller's list is left as it was
                views[first] = views[first][count:]
            short += 1
    return -short

"""Writes that survive short writes: ``pwrite`` continued until every byte is down."""

from __future__ import annotations

import errno
import os
import stat

from aeron_spark.transport.archive.errors import NotRegularFileError

#: Flags added to every open of a file the server keeps in its data directory: a FIFO there
#: (put by anyone who can write the directory) opens at once instead of waiting for a writer,
#: a symbolic link is refused instead of followed, and a forked child does not inherit it.
#: ``O_NONBLOCK`` has no effect on a regular file's reads and writes (Linux), so it stays set.
SAFE_OPEN_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def check_regular(fd: int, path: str) -> os.stat_result:
    """``fstat`` of ``fd`` (opened from ``path``); raises :class:`NotRegularFileError` naming
    ``path`` when it is not a regular file."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(
            f"NOT_REGULAR_FILE: {path} is not a regular file (mode {st.st_mode:o}: a FIFO, "
            "device or socket put in its place); it is left as it is: move it aside",
            path=path,
            mode=f"{st.st_mode:o}",
        )
    return st


def open_regular(
    path: str, flags: int = os.O_RDONLY, mode: int = 0o644, *, follow: bool = False
) -> int:
    """A descriptor of ``path`` opened with ``flags`` and :data:`SAFE_OPEN_FLAGS`, checked to
    be a regular file. Raises ``FileNotFoundError`` as ``os.open`` does, and
    :class:`NotRegularFileError` (an ``OSError``) for a FIFO, device, socket or symbolic link
    (``ELOOP`` of ``O_NOFOLLOW`` is told as one), never blocking. ``follow``: a symbolic link
    is followed (an operator's file named by an option, such as a mounted configuration's),
    its target still checked."""
    extra = SAFE_OPEN_FLAGS & ~os.O_NOFOLLOW if follow else SAFE_OPEN_FLAGS
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise NotRegularFileError(
            f"NOT_REGULAR_FILE: {path} is a symbolic link, which the server does not follow "
            "in its data directory; replace it with the file itself",
            path=path,
            mode="symlink",
        ) from exc
    try:
        check_regular(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, limit: int = -1, *, follow: bool = False) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``; all when -1), opened as
    :func:`open_regular` does."""
    with os.fdopen(open_regular(path, follow=follow), "rb") as fh:
        return fh.read(limit)


def create_fresh(path: str, mode: int = 0o644, flags: int = os.O_WRONLY) -> int:
    """A new empty regular file at ``path``, a temporary file's fixed name in the data
    directory: whatever is there (a file a killed server left, a FIFO or a symbolic link put
    there) is removed first, never opened nor followed, then the file is created
    ``O_CREAT|O_EXCL|O_NOFOLLOW`` (``FileExistsError`` if something is put there between the
    two). A plain ``open(tmp, "wb")`` waited for good on a FIFO, and wrote through a link. A
    directory there is not removed (nor what it holds): :class:`NotRegularFileError` naming it
    (it was a bare ``IsADirectoryError``)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError as exc:
        raise _directory_there(path) from exc
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def _directory_there(path: str) -> NotRegularFileError:
    return NotRegularFileError(
        f"NOT_REGULAR_FILE: {path} is a directory, where the server writes a file of its "
        "own; it is left as it is: move it aside",
        path=path,
        mode="directory",
    )


def replace_fresh(tmp: str, path: str) -> None:
    """``os.replace(tmp, path)``: a file made by :func:`create_fresh` renamed onto its final
    name. A directory at ``path`` (put there while the server runs; a start refuses one) is
    left as it is and ``tmp`` removed: :class:`NotRegularFileError` naming ``path`` (it was a
    bare ``IsADirectoryError``, the client's text, and the temporary file stayed)."""
    try:
        os.replace(tmp, path)
    except IsADirectoryError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _directory_there(path) from exc


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

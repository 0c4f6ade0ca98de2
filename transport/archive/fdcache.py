"""A bounded, shared cache of open file descriptors (segment and index files of recordings).

A process serving thousands of recordings cannot keep every one's files open: a stopped
recording holds no descriptor, and the files replays and appends use are opened on demand and
kept in this least-recently-used cache, at most ``capacity`` of them. A descriptor in use is
pinned (:meth:`FdCache.use`) and never closed under its user, even when another thread evicts
it (it is closed when the last user releases it), so a descriptor number is never reused while
a ``pread`` or ``pwrite`` may still run on it.

When ``open`` fails with ``EMFILE``/``ENFILE`` the cache closes every descriptor no one uses and
tries once more; if that fails too the ``OSError`` is raised to the caller (one request fails,
nothing else).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

from aeron_spark.transport.archive.diskio import open_regular

_NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE)


class _Entry:
    __slots__ = ("evicted", "fd", "pins")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pins = 0
        self.evicted = False


class FdCache:
    """See the module docstring. Keys are ``(path, writable)``."""

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, bool], _Entry] = OrderedDict()
        # the cached keys of the files directly in each directory (forget_under: a stopped
        # recording's files, without a walk of every cached file; issue 31)
        self._by_dir: dict[str, set[tuple[str, bool]]] = {}
        self._lock = threading.Lock()
        self.opens = 0
        self.adopted = 0  # descriptors opened elsewhere and handed over (adopt)
        self.evictions = 0
        self.open_failures = 0  # EMFILE/ENFILE even after closing every unused descriptor

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def use(self, path: str, writable: bool, create: bool = False) -> Iterator[int | None]:
        """A descriptor of ``path`` (read-write when ``writable``; created when ``create``),
        pinned for the ``with`` block; None when the file does not exist (and not ``create``)."""
        entry = self._acquire(path, writable, create)
        if entry is None:
            yield None
            return
        try:
            yield entry.fd
        finally:
            self._release(entry)

    def _acquire(self, path: str, writable: bool, create: bool = False) -> _Entry | None:
        """:meth:`use` without a context manager (``pin``: a publish's writes, issue 31): the
        entry (its ``fd``), pinned until :meth:`unpin`; None when the file does not exist."""
        key = (path, writable)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                entry.pins += 1
                return entry
            flags = (os.O_RDWR | (os.O_CREAT if create else 0)) if writable else os.O_RDONLY
            try:
                fd = self._open(path, flags)
            except FileNotFoundError:
                return None
            entry = _Entry(fd)
            entry.pins = 1
            self._entries[key] = entry
            self._by_dir.setdefault(os.path.normpath(os.path.dirname(path)), set()).add(key)
            self.opens += 1
            self._trim(self.capacity)
            return entry

    def adopt(self, directory: str, fds: dict[str, int]) -> None:
        """Cache ``fds`` (file name in ``directory`` -> a descriptor opened read-write
        elsewhere: a spare recording's files, opened ahead by its thread; issue 31); they are
        the cache's now. A descriptor already cached for a path is kept and the new one
        closed."""
        with self._lock:
            keys = self._by_dir.setdefault(os.path.normpath(directory), set())
            entries = self._entries
            for name, fd in fds.items():
                key = (f"{directory}{os.sep}{name}", True)
                if key in entries:
                    os.close(fd)
                    continue
                entries[key] = _Entry(fd)
                keys.add(key)
                self.adopted += 1
            self._trim(self.capacity)

    def _open(self, path: str, flags: int) -> int:
        # open_regular: a FIFO put in a segment's or index's place opens at once and is
        # refused (NOT_REGULAR_FILE) where reading it blocked the store's recovery for good
        try:
            return open_regular(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in _NO_DESCRIPTOR:
                raise
        self._trim(0)  # close every descriptor no one uses, then try once more
        try:
            return open_regular(path, flags, 0o644)
        except OSError as exc:
            if exc.errno in _NO_DESCRIPTOR:
                self.open_failures += 1
            raise

    def _trim(self, keep: int) -> None:
        """Close least recently used unpinned descriptors until at most ``keep`` are cached
        (pinned ones are only marked: their last user closes them)."""
        entries = self._entries
        while len(entries) > keep:
            # the least recently used unpinned one: the first, unless it is in use (never a
            # copy of every key: at capacity each new file evicts one, at every publish)
            victim = next((key for key, entry in entries.items() if not entry.pins), None)
            if victim is None:
                return
            entry = entries.pop(victim)
            self._unindex(victim)
            self.evictions += 1
            os.close(entry.fd)

    def _unindex(self, key: tuple[str, bool]) -> None:
        directory = os.path.normpath(os.path.dirname(key[0]))
        keys = self._by_dir.get(directory)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_dir[directory]

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.evicted and entry.pins == 0:
                os.close(entry.fd)

    # the same methods, no wrapper calls: a publish pins three files (its segment, its
    # acknowledged end, its index), six wrapper calls a publish on the server's loop (issue 31)
    pin = _acquire
    unpin = _release

    def forget(self, path: str) -> None:
        """Close the descriptors of ``path`` (before it is deleted or truncated away)."""
        with self._lock:
            for writable in (False, True):
                self._drop((path, writable))

    def forget_under(self, directory: str) -> int:
        """Close the descriptors of every file directly in ``directory`` (a stopped
        recording's); the cost follows that directory's files, not the cache's size."""
        with self._lock:
            keys = list(self._by_dir.get(os.path.normpath(directory), ()))
            for key in keys:
                self._drop(key)
        return len(keys)

    def _drop(self, key: tuple[str, bool]) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._unindex(key)
        if entry.pins:
            entry.evicted = True  # closed by its last user
        else:
            os.close(entry.fd)

    def close(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self._drop(key)

    def stats(self) -> dict[str, int]:
        return {
            "open_files": len(self._entries),
            "open_files_capacity": self.capacity,
            "file_opens": self.opens,
            "file_descriptors_adopted": self.adopted,
            "file_evictions": self.evictions,
            "file_open_failures": self.open_failures,
        }


__all__ = ["FdCache"]

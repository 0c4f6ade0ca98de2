"""A recording's position/time index, kept on disk: memory independent of retention.

The index file is a run of records ``(position int64, timestamp_ns int64)``, little-endian, both
columns strictly increasing in position and non-decreasing in time (the writer keeps the clock
from stepping back). It used to be loaded into two Python lists (~93 bytes an entry: a day at one
append a millisecond was ~8 GB); now memory holds only

- the entry count,
- a sparse level: every ``STRIDE``-th entry, in numpy arrays (16 bytes per ``STRIDE`` entries:
  about 0.3 MB for 10 million entries), read with one ``pread`` each when the recording opens,
- a few recently read blocks of ``STRIDE`` entries (an LRU of ``CACHED_BLOCKS``; a replay reads
  blocks in order, so almost every lookup hits the one it read last).

A lookup is a binary search of the sparse level, then one ``pread`` of a block (8 KiB) and a
binary search in it. Written by hand because the shape is specific (two sorted columns searched
by either, appended and cut at the end, read while another thread appends): ``numpy.memmap``
would make a truncation by the writer a SIGBUS in a reader, where a short ``pread`` is harmless.

Threads: one writer (``append``, ``cut``) and any number of readers. The count is raised only
after an entry's bytes are written and lowered before they are cut, so a reader never reads an
entry that is not there; a block read short (a cut raced it) gives the entries it got.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import numpy as np

from aeron_spark.transport.archive.diskio import pwrite_all

ENTRY = struct.Struct("<qq")
_DTYPE = np.dtype([("position", "<i8"), ("time", "<i8")])
STRIDE = 512  # entries per block: a block is 8 KiB
CACHED_BLOCKS = 4
_END = 1 << 63

# (path, writable, create) -> a context giving the file's descriptor (None: no such file)
OpenFile = Callable[[str, bool, bool], AbstractContextManager[int | None]]


class TimeIndex:
    """The index of one recording (see the module docstring).

    ``limit_position``: consider only the entries below it (a read-only view of a range another
    process has reported recorded; entries past it may be rewritten by their writer)."""

    def __init__(
        self,
        path: str,
        open_file: OpenFile,
        *,
        limit_position: int | None = None,
        empty: bool = False,
    ) -> None:
        self.path = path
        self._open = open_file
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, tuple[list[int], list[int]]] = OrderedDict()
        self._top_pos = np.empty(64, dtype=np.int64)
        self._top_time = np.empty(64, dtype=np.int64)
        self._count = 0
        self._last: tuple[int, int] | None = None
        self._hint: tuple[int, int, int] | None = None  # (block, first position, next's)
        if not empty:  # ``empty``: a new recording's, known to hold nothing (nothing to read)
            self._load(limit_position)

    # --- loading -----------------------------------------------------------------------------

    def _load(self, limit_position: int | None) -> None:
        with self._open(self.path, False, False) as fd:
            if fd is None:
                return
            count = os.fstat(fd).st_size // ENTRY.size
            raw = bytearray()
            for i in range(0, count, STRIDE):  # the sparse level: one pread per block
                raw += os.pread(fd, ENTRY.size, i * ENTRY.size)
        tops = np.frombuffer(bytes(raw[: len(raw) // ENTRY.size * ENTRY.size]), dtype=_DTYPE)
        del raw
        if len(tops) < (count + STRIDE - 1) // STRIDE or bool(
            np.any(np.diff(tops["position"]) <= 0) or np.any(np.diff(tops["time"]) < 0)
        ):
            count = self._first_unsorted(count)  # damaged mid-file (never written so): keep before
            tops = tops[: (count + STRIDE - 1) // STRIDE]
        self._set_top(tops)
        self._count = count
        # the last block is checked entry by entry: a torn or stale tail ends the index there
        if count:
            j = (count - 1) // STRIDE
            positions, times, n = self._read_block(j)
            good = next(
                (
                    k
                    for k in range(1, n)
                    if positions[k] <= positions[k - 1] or times[k] < times[k - 1]
                ),
                n,
            )
            self._count = j * STRIDE + good
            self._cache.clear()
        if limit_position is not None:
            self._count = self._first_position(limit_position)
            self._trim_top()
        self._refresh_last()

    def _first_unsorted(self, count: int) -> int:
        """The number of entries before the first out of order one (a full scan: only when the
        sparse level showed disorder)."""
        with self._open(self.path, False, False) as fd:
            assert fd is not None
            last: tuple[int, int] | None = None
            for start in range(0, count, 65536):
                n = min(count - start, 65536)
                data = os.pread(fd, n * ENTRY.size, start * ENTRY.size)
                for k, entry in enumerate(ENTRY.iter_unpack(data[: len(data) // 16 * 16])):
                    if last is not None and (entry[0] <= last[0] or entry[1] < last[1]):
                        return start + k
                    last = entry
        return count

    def _set_top(self, tops: np.ndarray) -> None:
        size = max(64, len(tops) * 2)
        self._top_pos = np.empty(size, dtype=np.int64)
        self._top_time = np.empty(size, dtype=np.int64)
        self._top_pos[: len(tops)] = tops["position"]
        self._top_time[: len(tops)] = tops["time"]

    def _trim_top(self) -> None:
        """Drop cached blocks past the count (after a cut; the sparse level is read only up to
        the count, and a cached block is used only up to it)."""
        for j in [j for j in self._cache if (j + 1) * STRIDE > self._count]:
            del self._cache[j]
        self._hint = None

    def _refresh_last(self) -> None:
        self._last = self.entry(self._count - 1) if self._count else None

    # --- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    @property
    def last(self) -> tuple[int, int] | None:
        """The last entry ``(position, time)``, or None."""
        return self._last

    def _read_block(self, j: int) -> tuple[list[int], list[int], int]:
        """Block ``j``: its positions, its times and how many of them are below the count
        (cached as lists, which ``bisect`` searches faster than numpy does at this size; a
        cached block shorter than the count asks for, the last one before appends, is read
        again)."""
        want = min(STRIDE, self._count - j * STRIDE)
        with self._lock:
            block = self._cache.get(j)
            if block is not None:
                self._cache.move_to_end(j)
        if block is not None and len(block[0]) >= want:
            return block[0], block[1], want
        with self._open(self.path, False, False) as fd:
            data = b"" if fd is None else os.pread(fd, want * ENTRY.size, j * STRIDE * ENTRY.size)
        arr = np.frombuffer(data[: len(data) // ENTRY.size * ENTRY.size], dtype=_DTYPE)
        block = (arr["position"].tolist(), arr["time"].tolist())
        if len(arr) == want:
            with self._lock:
                self._cache[j] = block
                while len(self._cache) > CACHED_BLOCKS:
                    self._cache.popitem(last=False)
        return block[0], block[1], len(arr)

    def entry(self, i: int) -> tuple[int, int]:
        """Entry ``i`` (0 <= i < len)."""
        positions, times, _n = self._read_block(i // STRIDE)
        return positions[i % STRIDE], times[i % STRIDE]

    def _block_of(self, position: int) -> int:
        """The block holding the last entry at or below ``position`` (-1: none). The last
        answer's bounds are kept: a replay asks about one block many times in a row."""
        hint = self._hint
        if hint is not None and hint[1] <= position < hint[2]:
            return hint[0]
        tops = (self._count + STRIDE - 1) // STRIDE
        j = int(np.searchsorted(self._top_pos[:tops], position, side="right")) - 1
        if j >= 0:
            upper = int(self._top_pos[j + 1]) if j + 1 < tops else _END
            self._hint = (j, int(self._top_pos[j]), upper)
        return j

    def floor(self, position: int) -> tuple[int, int, int] | None:
        """``(i, position, time)`` of the last entry at or below ``position``, or None."""
        j = self._block_of(position)
        if j < 0:
            return None
        positions, times, n = self._read_block(j)
        k = bisect.bisect_right(positions, position, 0, n) - 1
        if k < 0:  # the block was cut under us
            return None
        return j * STRIDE + k, positions[k], times[k]

    def next_position(self, position: int) -> int | None:
        """The first indexed position above ``position``, or None."""
        found = self.floor(position)
        i = 0 if found is None else found[0] + 1
        return self.entry(i)[0] if i < self._count else None

    def time_at(self, position: int) -> int | None:
        """The time of the last entry at or below ``position``, or None."""
        found = self.floor(position)
        return None if found is None else found[2]

    def first_at_or_after(self, timestamp_ns: int, min_position: int) -> int | None:
        """The position of the first entry with time >= ``timestamp_ns`` and position >=
        ``min_position`` (both columns are sorted), or None."""
        i = max(self._first_time(timestamp_ns), self._first_position(min_position))
        return self.entry(i)[0] if i < self._count else None

    def _first_time(self, timestamp_ns: int) -> int:
        tops = (self._count + STRIDE - 1) // STRIDE
        j = int(np.searchsorted(self._top_time[:tops], timestamp_ns, side="left"))
        if j == 0:
            return 0
        _positions, times, n = self._read_block(j - 1)
        k = bisect.bisect_left(times, timestamp_ns, 0, n)
        return (j - 1) * STRIDE + k if k < n else j * STRIDE

    def _first_position(self, position: int) -> int:
        found = self.floor(position - 1)
        return 0 if found is None else found[0] + 1

    def positions_from_end(self) -> Iterator[int]:
        """Indexed positions, last first (recovery looks for the last one whose bytes exist)."""
        for j in range((self._count - 1) // STRIDE, -1, -1):
            positions, _times, n = self._read_block(j)
            yield from reversed(positions[:n])

    # --- writing (one writer) ----------------------------------------------------------------

    def append(self, position: int, timestamp_ns: int, fd: int | None = None) -> None:
        """Write one entry at the end (position above the last, time not below it), through
        ``fd`` (the index file's, writable) when the caller holds it. A failed write raises
        ``OSError``; the caller cuts the file back."""
        i = self._count
        if fd is not None:
            entry = ENTRY.pack(position, timestamp_ns)
            if os.pwrite(fd, entry, i * ENTRY.size) != ENTRY.size:  # short: continued
                pwrite_all(fd, entry, i * ENTRY.size, self.path)  # (rewrites its start: same)
        else:
            with self._open(self.path, True, True) as opened:
                assert opened is not None
                pwrite_all(opened, ENTRY.pack(position, timestamp_ns), i * ENTRY.size, self.path)
        if i % STRIDE == 0:
            j = i // STRIDE
            if j >= len(self._top_pos):
                self._top_pos = np.concatenate([self._top_pos, np.empty_like(self._top_pos)])
                self._top_time = np.concatenate([self._top_time, np.empty_like(self._top_time)])
            self._top_pos[j] = position
            self._top_time[j] = timestamp_ns
            self._hint = None  # the last block's upper bound is now this entry
        self._last = (position, timestamp_ns)
        self._count = i + 1  # last: readers see the entry only once it is written

    def cut(self, position: int, *, fsync: bool = False) -> None:
        """Forget the entries at or above ``position``, in memory first, then in the file."""
        found = self.floor(position - 1)
        keep = 0 if found is None else found[0] + 1
        if keep >= self._count:
            self._truncate_file(keep, fsync)
            return
        self._count = keep
        with self._lock:
            self._trim_top()
        self._refresh_last()
        self._truncate_file(keep, fsync)

    def _truncate_file(self, keep: int, fsync: bool) -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.path.getsize(self.path) > keep * ENTRY.size:
                os.truncate(self.path, keep * ENTRY.size)
                if fsync:
                    fd = os.open(self.path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)

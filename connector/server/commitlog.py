"""An append-only, fsynced log of sink commits that survives crashes.

Record layout: ``length (uint32) | crc32 of body (uint32) | msgpack body``. A record is durable
once :meth:`CommitLog.append` returns (write + ``fsync``). On open, records are read until the
first incomplete or corrupt one -- the torn tail of a crash -- and the file is truncated there, so
the log is always a clean prefix of what was appended. A record that does not read with a whole
record after it is damage in the middle, not a torn tail (only the last record can be torn):
the open refuses with :class:`~aeron_spark.connector.errors.CommitLogCorruptError` and leaves
the file as it is (cutting there forgot every acknowledged commit after it).

Two record types, written by :class:`connector.server.staging.SinkCommitter`:

- ``{"t": "begin", sink_id, batch_id, stream_id, recording_id, session_id, start_position,
  parts: [...], owner}`` -- the commit's plan, written before any frame is appended;
- ``{"t": "done", sink_id, batch_id, recording_id, start_position, end_position, count, bytes,
  owner}`` -- written after the frames are durable. A ``begin`` without ``done`` is resumed on
  restart. ``owner`` (issue 28) is the committing client's key (hex; "" on a server without
  ``--authorized-keys``): the first record of a sink id with one makes the sink that key's;
  records written before it have none (a ``begin`` without it names parts by their old names);
- a commit of several streams (a sink routing rows by a ``stream_id`` column; issue 32) has
  ``streams: [{stream_id, recording_id, session_id, start_position}, ...]`` in its ``begin`` and
  ``streams: [{stream_id, recording_id, start_position, end_position, count, bytes}, ...]``, with
  the totals ``count`` and ``bytes``, in its ``done``, instead of the one stream's fields;
- ``{"t": "cancel", sink_id, batch_id}`` -- the commit failed (disk full) and its frames were cut
  off again; the ``begin`` before it is not resumed (the client was told, and sends it again).

Bounded (issue 31 item 6): :meth:`CommitLog.compact` rewrites the log with the records the
committer still needs (its window of recent commits per sink, the commit that made each sink
recording's visible end; see ``staging.SinkCommitter``), through a fsynced temporary file renamed
over the log, so a crash leaves the old log or the new one, never a mix.
Compaction and open read the log record by record in chunks of 64 KiB (a whole-log read left
the allocator's high-water mark for good: +5.3 MB of a soak server's RSS at its first
compaction), so their extra memory is a chunk's, not the log's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from aeron_spark.connector.errors import CommitLogCorruptError
from aeron_spark.transport.archive.diskio import create_fresh, open_regular
from aeron_spark.transport.archive.recordings import fsync_dir

_RECORD = struct.Struct("<II")
MAX_RECORD_BYTES = 64 * 1024 * 1024


_CHUNK = 64 * 1024  # bytes read or written at a time: a scan's memory, not the log's size


def _scan(fd: int, limit: int | None = None) -> Iterator[tuple[dict[str, Any], int]]:
    """The whole records of the log open at ``fd`` from its start, one at a time, each with
    the offset where it ends; stops at the first incomplete or corrupt record (a torn tail), at
    the end of the file or at ``limit`` bytes. Reads in chunks of :data:`_CHUNK` (or one
    record, if larger): its memory is bounded by a record, not by the log (issue 31 item 6: a
    whole-log read left the allocator's high-water mark +5 MB above the soak's baseline)."""
    buf = b""  # the file's bytes from ``base``; ``pos`` the next record's start in it
    base = pos = 0
    eof = False

    def fill(need: int) -> bool:  # at least ``need`` bytes past ``pos`` in ``buf``
        nonlocal buf, base, pos, eof
        while len(buf) - pos < need and not eof:
            at = base + len(buf)
            want = max(_CHUNK, need - (len(buf) - pos))
            if limit is not None:
                want = min(want, limit - at)
            more = os.pread(fd, want, at) if want > 0 else b""
            if not more:
                eof = True
                break
            buf = buf[pos:] + more
            base += pos
            pos = 0
        return len(buf) - pos >= need

    while fill(_RECORD.size):
        length, crc = _RECORD.unpack_from(buf, pos)
        if length > MAX_RECORD_BYTES or not fill(_RECORD.size + length):
            return
        body = buf[pos + _RECORD.size : pos + _RECORD.size + length]
        if zlib.crc32(body) != crc:
            return
        try:
            record = msgpack.unpackb(body, raw=False)
        except Exception:  # a corrupt body that happens to match its crc: stop here
            return
        if not isinstance(record, dict):
            return
        pos += _RECORD.size + length
        yield record, base + pos


def _record_at(data: bytes, pos: int) -> bool:
    """Whether a whole, readable record (as :func:`_scan` reads one) begins at ``pos``."""
    if pos + _RECORD.size > len(data):
        return False
    length, crc = _RECORD.unpack_from(data, pos)
    end = pos + _RECORD.size + length
    if not 0 < length <= MAX_RECORD_BYTES or end > len(data):
        return False
    body = data[pos + _RECORD.size : end]
    if zlib.crc32(body) != crc:
        return False
    try:
        return isinstance(msgpack.unpackb(body, raw=False), dict)
    except Exception:  # noqa: BLE001 - not a record
        return False


# a record's body is a msgpack map: its first byte is a fixmap, map16 or map32 marker
_MAP_AT_BODY = re.compile(rb"(?=.{8}[\x80-\x8f\xde\xdf])", re.DOTALL)


def _whole_record_after(fd: int, bad: int, size: int) -> bool:
    """Whether the bytes from ``bad`` (where :func:`_scan` stopped) to ``size`` hold a whole,
    readable record past ``bad``: then the record at ``bad`` is damaged in the middle of the
    log, not a crash's torn tail (a record is appended and fsynced whole after the one before
    it, so only the last can be torn, and nothing readable follows it). More than a record's
    worth of bytes is never a torn tail. Else the bytes are searched at every offset whose
    body would begin with a map (a damaged length hides where the next record begins)."""
    if size - bad > _RECORD.size + MAX_RECORD_BYTES:
        return True
    data = os.pread(fd, size - bad, bad)
    if len(data) >= _RECORD.size:
        length, _crc = _RECORD.unpack_from(data, 0)
        if _record_at(data, _RECORD.size + length):  # the common case: a damaged body
            return True
    return any(_record_at(data, m.start()) for m in _MAP_AT_BODY.finditer(data, 1))


def _write_all(fd: int, data: bytes | bytearray, name: str) -> None:
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            count = os.write(fd, view[done:])
            if count <= 0:
                raise OSError(errno.ENOSPC, "write made no progress", name)
            done += count


def _encode(record: dict[str, Any]) -> bytes:
    body = msgpack.packb(record, use_bin_type=True)
    return _RECORD.pack(len(body), zlib.crc32(body)) + body


class CommitLog:
    """The log file plus the records it held at open time (``records``: the reader takes them
    and may drop the list)."""

    def __init__(self, path: str) -> None:
        self.path = path
        # a FIFO opened read-write does not block, but reading it did (the start hung), and a
        # symlink would be followed: refused with NOT_REGULAR_FILE naming the file
        self._fd = open_regular(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.records: list[dict[str, Any]] = []
            good_end = 0
            for record, end in _scan(self._fd):
                self.records.append(record)
                good_end = end
            length = os.fstat(self._fd).st_size
            if good_end < length and _whole_record_after(self._fd, good_end, length):
                raise CommitLogCorruptError(
                    f"COMMIT_LOG_CORRUPT: the sink commit log {path} does not read at byte "
                    f"{good_end} of {length}, with whole records after it: not a crash's torn "
                    "tail (cutting it there would forget the acknowledged commits after it), "
                    "so it is left as it is and the server does not start. Restore the file "
                    "from a backup or a replica, or move it aside to start without its commits",
                    path=path,
                    offset=good_end,
                    size=length,
                )
        except BaseException:
            os.close(self._fd)
            raise
        self.torn_bytes_truncated = length - good_end
        self.compactions = 0
        self.compaction_failures = 0  # refused (a record no longer reads) or failed (a full disk)
        if self.torn_bytes_truncated:
            os.ftruncate(self._fd, good_end)
            os.fsync(self._fd)
        self._size = good_end
        self.failed_appends = 0
        fsync_dir(os.path.dirname(path) or ".")

    def append(self, record: dict[str, Any]) -> None:
        """Write and fsync one record, all or nothing: a short write is continued; a failed
        one (ENOSPC, EIO) raises after cutting the file back to its last whole record, so a
        later record never follows a torn one (which would hide it from the next open)."""
        data = memoryview(_encode(record))
        try:
            if os.fstat(self._fd).st_size != self._size:  # an earlier cut failed: retry it
                os.ftruncate(self._fd, self._size)
            done = 0
            while done < len(data):
                count = os.pwrite(self._fd, data[done:], self._size + done)
                if count <= 0:
                    raise OSError(errno.ENOSPC, "write made no progress", self.path)
                done += count
            os.fsync(self._fd)
        except BaseException:
            self.failed_appends += 1
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    @property
    def size(self) -> int:
        """The log's length in bytes (its whole records)."""
        return self._size

    def compact(self, keep: Callable[[dict[str, Any]], dict[str, Any] | None]) -> int:
        """Rewrite the log with what ``keep`` returns for each record, in order (None: drop
        it); its new length. Atomic: a fsynced temporary file renamed over the log, whose
        descriptor the log keeps (nothing is opened after the rename). A failure before the
        rename (a full disk) leaves the log as it was and raises; one after it (the directory's
        fsync) raises with the compacted log in use, so later appends go to the log's file."""
        tmp = self.path + ".compact"
        # read-write: after the rename this descriptor is the log's (nothing is opened after
        # the rename, so nothing can fail between it and the switch)
        fd = create_fresh(tmp, 0o644, os.O_RDWR)  # what is there removed, never followed
        try:
            # record by record from the log's own descriptor (its whole records: up to
            # ``_size``), written in chunks: memory bounded by a record, not the log's size
            size = 0
            out = bytearray()
            end = 0
            for record, record_end in _scan(self._fd, self._size):
                end = record_end
                kept = keep(record)
                if kept is not None:
                    data = _encode(kept)
                    out += data
                    size += len(data)
                    if len(out) >= _CHUNK:
                        _write_all(fd, out, tmp)
                        out.clear()
            if end != self._size:  # a record the log held no longer reads: keep the log
                raise OSError(errno.EIO, f"commit log unreadable at byte {end}", self.path)
            if out:
                _write_all(fd, out, tmp)
                out.clear()
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:  # before the rename, or the rename itself: the log as it was
            self.compaction_failures += 1
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        # the rename is done: from here on the log is the new file, whatever fails after
        old, self._fd = self._fd, fd
        self._size = size
        self.compactions += 1
        with contextlib.suppress(OSError):
            os.close(old)
        fsync_dir(os.path.dirname(self.path) or ".")  # may raise: the rename is not yet durable
        return size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["CommitLog"]

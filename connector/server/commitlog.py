"""An append-only, fsynced log of sink commits that survives crashes.

Record layout: ``length (uint32) | crc32 of body (uint32) | msgpack body``. A record is durable
once :meth:`CommitLog.append` returns (write + ``fsync``). On open, records are read until the
first incomplete or corrupt one -- the torn tail of a crash -- and the file is truncated there, so
the log is always a clean prefix of what was appended.

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
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from aeron_spark.transport.archive.recordings import fsync_dir

_RECORD = struct.Struct("<II")
MAX_RECORD_BYTES = 64 * 1024 * 1024


def _read(path: str) -> tuple[list[dict[str, Any]], int, int]:
    """The whole records of the log at ``path``, where they end, and the file's length."""
    records: list[dict[str, Any]] = []
    good_end = 0
    if not os.path.exists(path):
        return records, 0, 0
    with open(path, "rb") as fh:
        data = fh.read()
    offset = 0
    while offset + _RECORD.size <= len(data):
        length, crc = _RECORD.unpack_from(data, offset)
        end = offset + _RECORD.size + length
        if length > MAX_RECORD_BYTES or end > len(data):
            break
        body = data[offset + _RECORD.size : end]
        if zlib.crc32(body) != crc:
            break
        try:
            record = msgpack.unpackb(body, raw=False)
        except Exception:  # a corrupt body that happens to match its crc: stop here
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        offset = end
        good_end = end
    return records, good_end, len(data)


def _encode(record: dict[str, Any]) -> bytes:
    body = msgpack.packb(record, use_bin_type=True)
    return _RECORD.pack(len(body), zlib.crc32(body)) + body


class CommitLog:
    """The log file plus the records it held at open time (``records``: the reader takes them
    and may drop the list)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.records, good_end, length = _read(path)
        self.torn_bytes_truncated = length - good_end
        self.compactions = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
        records, _end, _length = _read(self.path)
        kept = (keep(record) for record in records)
        tmp = self.path + ".compact"
        # read-write: after the rename this descriptor is the log's (nothing is opened after
        # the rename, so nothing can fail between it and the switch)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            size = 0
            for record in kept:
                if record is not None:
                    data = _encode(record)
                    done = 0
                    while done < len(data):
                        count = os.write(fd, data[done:])
                        if count <= 0:
                            raise OSError(errno.ENOSPC, "write made no progress", tmp)
                        done += count
                    size += len(data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            os.replace(tmp, self.path)
        except BaseException:
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

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
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import zlib
from typing import Any

import msgpack

from aeron_spark.transport.archive.recordings import fsync_dir

_RECORD = struct.Struct("<II")
MAX_RECORD_BYTES = 64 * 1024 * 1024


class CommitLog:
    """The log file plus the records it held at open time (``records``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.torn_bytes_truncated = 0
        good_end = 0
        if os.path.exists(path):
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
                self.records.append(record)
                offset = end
                good_end = end
            self.torn_bytes_truncated = len(data) - good_end
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
        body = msgpack.packb(record, use_bin_type=True)
        data = memoryview(_RECORD.pack(len(body), zlib.crc32(body)) + body)
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

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["CommitLog"]

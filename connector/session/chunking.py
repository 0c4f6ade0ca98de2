"""Splitting messages larger than the transport's limit into chunks, and reassembling them.

Aeron caps one message at ``min(term_length / 8, 16 MiB)``. A control message (a publish of many
payloads, a large stage request) can be bigger, so like dorkbox's streaming manager the sender
splits it into chunk messages and the receiver reassembles it, bounded in memory, with a clear
error when a chunk is missing.

Chunk message layout (little-endian, 28-byte header)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------+-----------------------------------------------+
    | kind = 0x03   |                  reserved (0)                 |
    +---------------+-----------------------------------------------+
    |                     payload id (uint64)                       |
    |                                                               |
    +---------------------------------------------------------------+
    |                     chunk index (uint32)                      |
    +---------------------------------------------------------------+
    |                     chunk count (uint32)                      |
    +---------------------------------------------------------------+
    |                  total payload length (uint64)                |
    |                                                               |
    +---------------------------------------------------------------+
    |                     chunk bytes ...                           |

Invariants: chunks of one payload are sent in index order and, because a session is an ordered
reliable stream, arrive in index order with nothing interleaved from the same sender. So the
reassembler holds at most one open payload; any other chunk than the next expected one -- a gap,
a repeat, or the start of another payload while one is open -- is a :class:`ChunkMissingError`
and the open payload is discarded. An open payload also expires after ``timeout_ns``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from aeron_spark.connector.errors import (
    ChunkMissingError,
    ControlProtocolError,
    PayloadTooLargeError,
)

from aeron_spark.errors import ConfigurationError

KIND_CHUNK = 0x03
CHUNK_HEADER = struct.Struct("<B3xQIIQ")
CHUNK_HEADER_LENGTH = CHUNK_HEADER.size
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_NS = 60_000_000_000


def is_chunk(message: bytes | bytearray | memoryview) -> bool:
    return len(message) > 0 and message[0] == KIND_CHUNK


def split(
    payload: bytes | bytearray | memoryview, max_message_length: int, payload_id: int
) -> Iterator[bytes]:
    """Chunk messages carrying ``payload``, each at most ``max_message_length`` bytes.

    Callers send ``payload`` as it is when it fits; this always produces chunk messages (at least
    one), so the receiver sees the same framing whatever the size.
    """
    piece = max_message_length - CHUNK_HEADER_LENGTH
    if piece <= 0:
        raise ConfigurationError(
            "max_message_length", max_message_length, f"more than {CHUNK_HEADER_LENGTH} bytes"
        )
    view = memoryview(payload)
    total = len(view)
    count = max(1, -(-total // piece))
    pid = payload_id & 0xFFFF_FFFF_FFFF_FFFF
    for index in range(count):
        part = view[index * piece : (index + 1) * piece]
        yield CHUNK_HEADER.pack(KIND_CHUNK, pid, index, count, total) + part


class Reassembler:
    """Rebuilds chunked payloads of one ordered sender, bounded by ``max_payload_bytes``.

    ``feed(chunk, now_ns)`` returns the whole payload when its last chunk arrives, else ``None``.
    Counters: ``completed``, ``discarded`` (open payloads dropped by an error or expiry).
    """

    def __init__(
        self,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        timeout_ns: int = DEFAULT_TIMEOUT_NS,
    ) -> None:
        if max_payload_bytes <= 0:
            raise ConfigurationError(
                "max_payload_bytes", max_payload_bytes, "a positive byte count"
            )
        if timeout_ns <= 0:
            raise ConfigurationError("timeout_ns", timeout_ns, "a positive duration")
        self.max_payload_bytes = max_payload_bytes
        self.timeout_ns = timeout_ns
        self._payload_id: int | None = None
        self._buffer = bytearray()
        self._filled = 0
        self._next_index = 0
        self._count = 0
        self._deadline_ns = 0
        self.completed = 0
        self.discarded = 0

    @property
    def open_payload_id(self) -> int | None:
        return self._payload_id

    @property
    def deadline_ns(self) -> int | None:
        """When the open payload expires (``None`` when nothing is open)."""
        return None if self._payload_id is None else self._deadline_ns

    def _discard(self) -> None:
        if self._payload_id is not None:
            self.discarded += 1
        self._payload_id = None
        self._buffer = bytearray()
        self._filled = 0

    def check_expired(self, now_ns: int) -> None:
        """Raise :class:`ChunkMissingError` if the open payload has waited too long."""
        if self._payload_id is not None and now_ns >= self._deadline_ns:
            pid, expected = self._payload_id, self._next_index
            self._discard()
            raise ChunkMissingError(
                f"chunk {expected} of payload {pid} did not arrive within "
                f"{self.timeout_ns / 1e9:.1f} s",
                payload_id=pid,
                expected_index=expected,
                got_index=None,
            )

    def feed(
        self, message: bytes | bytearray | memoryview, now_ns: int
    ) -> bytes | bytearray | None:
        """The whole payload once its last chunk arrives (a multi-chunk payload is handed over
        as the buffer it was assembled in: no copy), else None."""
        if len(message) < CHUNK_HEADER_LENGTH or message[0] != KIND_CHUNK:
            raise ControlProtocolError(f"not a chunk message ({len(message)} bytes)")
        _, pid, index, count, total = CHUNK_HEADER.unpack_from(message, 0)
        body = memoryview(message)[CHUNK_HEADER_LENGTH:]
        self.check_expired(now_ns)
        if self._payload_id is None:
            if index != 0:
                self.discarded += 1
                raise ChunkMissingError(
                    f"chunk {index} of payload {pid} arrived without its first chunk",
                    payload_id=pid,
                    expected_index=0,
                    got_index=index,
                )
            if count == 0 or total > self.max_payload_bytes:
                raise PayloadTooLargeError(
                    f"chunked payload {pid} of {total} bytes in {count} chunks exceeds the "
                    f"limit of {self.max_payload_bytes} bytes",
                    length=total,
                    limit=self.max_payload_bytes,
                )
            if count == 1:
                if len(body) != total:
                    raise ChunkMissingError(
                        f"payload {pid}: single chunk has {len(body)} bytes, header says {total}",
                        payload_id=pid,
                        expected_index=0,
                        got_index=0,
                    )
                self.completed += 1
                return bytes(body)
            self._payload_id = pid
            self._count = count
            self._buffer = bytearray(total)
            self._filled = 0
            self._next_index = 0
        elif pid != self._payload_id or index != self._next_index or count != self._count:
            expected, open_id = self._next_index, self._payload_id
            self._discard()
            raise ChunkMissingError(
                f"expected chunk {expected} of payload {open_id}, "
                f"got chunk {index} of payload {pid}",
                payload_id=open_id,
                expected_index=expected,
                got_index=index,
            )
        end = self._filled + len(body)
        if end > len(self._buffer):
            open_id = self._payload_id
            self._discard()
            raise ChunkMissingError(
                f"payload {open_id}: chunks exceed the announced length",
                payload_id=open_id,
                expected_index=index,
                got_index=index,
            )
        self._buffer[self._filled : end] = body
        self._filled = end
        self._next_index = index + 1
        self._deadline_ns = now_ns + self.timeout_ns
        if self._next_index < self._count:
            return None
        if self._filled != len(self._buffer):
            open_id = self._payload_id
            self._discard()
            raise ChunkMissingError(
                f"payload {open_id}: chunks are shorter than announced",
                payload_id=open_id,
                expected_index=index,
                got_index=index,
            )
        result = self._buffer  # handed over: the next payload gets a buffer of its own
        self._payload_id = None
        self._buffer = bytearray()
        self.completed += 1
        return result


__all__ = [
    "CHUNK_HEADER",
    "CHUNK_HEADER_LENGTH",
    "KIND_CHUNK",
    "Reassembler",
    "is_chunk",
    "split",
]

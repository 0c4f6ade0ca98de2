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
and the open payload is discarded. An open payload also expires ``timeout_ns`` after its first
chunk (a message must be whole within it, so a trickle of tiny chunks cannot hold memory): on
the clock (:meth:`Reassembler.expire`, which the server calls every pass), not only when
its next chunk arrives.

Memory is charged as bytes arrive, never as announced: the announced length is only checked
against ``max_payload_bytes`` (a header announcing more is refused at once); the buffer grows with
the chunks, and every byte held by an open payload is charged to a :class:`ReassemblyBudget`
shared by all of a server's sessions (issue 28, item 2: a 92-byte header announcing 256 MiB made
the server zero-fill 256 MiB). A chunk that would take the budget past its bound is refused
(:class:`LimitExceededError`) and its open payload discarded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from aeron_spark.connector.errors import (
    ChunkMissingError,
    ControlProtocolError,
    LimitExceededError,
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


def split_parts(
    parts: Sequence[bytes | bytearray | memoryview], max_message_length: int, payload_id: int
) -> Iterator[bytearray]:
    """Chunk messages carrying the concatenation of ``parts`` (as :func:`split` of
    ``b"".join(parts)``, byte for byte), without ever joining them: each chunk is built from
    slices of the parts, so what this holds is one chunk, whatever the payload's size (a sender
    of a large message keeps its payload and one chunk, not a second copy of the message)."""
    piece = max_message_length - CHUNK_HEADER_LENGTH
    if piece <= 0:
        raise ConfigurationError(
            "max_message_length", max_message_length, f"more than {CHUNK_HEADER_LENGTH} bytes"
        )
    views = [memoryview(part).cast("B") for part in parts]
    total = sum(len(view) for view in views)
    count = max(1, -(-total // piece))
    pid = payload_id & 0xFFFF_FFFF_FFFF_FFFF
    current, offset = 0, 0  # the part being cut and the offset in it
    for index in range(count):
        want = min(piece, total - index * piece)
        chunk = bytearray(CHUNK_HEADER.pack(KIND_CHUNK, pid, index, count, total))
        while want:
            view = views[current]
            take = min(want, len(view) - offset)
            chunk += view[offset : offset + take]
            offset += take
            want -= take
            if offset == len(view):
                current, offset = current + 1, 0
        yield chunk


class ReassemblyBudget:
    """The bytes that incomplete chunked payloads may hold at once, across every reassembler
    sharing it (a server's sessions). With ``parent``, a share of that budget (one client's
    sessions): a charge must fit both. ``option`` names the bound in a refusal. Counters:
    ``refused`` (chunks refused for it)."""

    def __init__(
        self,
        max_bytes: int,
        parent: ReassemblyBudget | None = None,
        option: str = "--max-incomplete-bytes",
    ) -> None:
        if max_bytes <= 0:
            raise ConfigurationError("max_bytes", max_bytes, "a positive byte count")
        self.max_bytes = max_bytes
        self.parent = parent
        self.option = option
        self.held = 0
        self.open = 0  # payloads open in the reassemblers sharing it
        self.refused = 0

    def refusing(self, nbytes: int) -> ReassemblyBudget | None:
        """Charge ``nbytes`` (to the parent too); the budget that refuses them, charging
        nothing, or None."""
        if self.held + nbytes > self.max_bytes:
            self.refused += 1
            return self
        if self.parent is not None:
            refused = self.parent.refusing(nbytes)
            if refused is not None:
                return refused
        self.held += nbytes
        return None

    def try_charge(self, nbytes: int) -> bool:
        return self.refusing(nbytes) is None

    def release(self, nbytes: int) -> None:
        self.held -= nbytes
        if self.parent is not None:
            self.parent.release(nbytes)


class Reassembler:
    """Rebuilds chunked payloads of one ordered sender, bounded by ``max_payload_bytes`` (the
    bytes one incomplete payload may hold: what is announced past it is refused at its first
    chunk) and, with ``budget``, by what all reassemblers sharing that budget hold together.

    ``feed(chunk, now_ns)`` returns the whole payload when its last chunk arrives, else ``None``.
    Counters: ``completed``, ``discarded`` (open payloads dropped by an error or expiry),
    ``expired`` (of those, dropped by :meth:`expire`), ``refused`` (chunks refused for the budget).
    """

    def __init__(
        self,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        timeout_ns: int = DEFAULT_TIMEOUT_NS,
        budget: ReassemblyBudget | None = None,
    ) -> None:
        if max_payload_bytes <= 0:
            raise ConfigurationError(
                "max_payload_bytes", max_payload_bytes, "a positive byte count"
            )
        if timeout_ns <= 0:
            raise ConfigurationError("timeout_ns", timeout_ns, "a positive duration")
        self.max_payload_bytes = max_payload_bytes
        self.timeout_ns = timeout_ns
        self.budget = budget
        # the budget that refused the last chunk refused (a share's, or its parent's)
        self.refused_by: ReassemblyBudget | None = None
        self._payload_id: int | None = None
        self._buffer = bytearray()  # grows with the chunks: held bytes only, never announced
        self._total = 0  # the announced length
        self._next_index = 0
        self._count = 0
        self._deadline_ns = 0
        self.completed = 0
        self.discarded = 0
        self.expired = 0
        self.refused = 0

    @property
    def is_open(self) -> bool:
        """A payload is incomplete: some of its chunks came, not its last."""
        return self._payload_id is not None

    @property
    def held_bytes(self) -> int:
        """The bytes the open payload holds (charged to the budget)."""
        return len(self._buffer)

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
            if self.budget is not None:
                self.budget.open -= 1
        self._payload_id = None
        self._release()

    def _release(self) -> None:
        if self.budget is not None:
            self.budget.release(len(self._buffer))
        self._buffer = bytearray()

    def expire(self, now_ns: int) -> bool:
        """Discard the open payload if it waited past its deadline (the clock's check, with no
        chunk needed); True when one was discarded."""
        if self._payload_id is None or now_ns < self._deadline_ns:
            return False
        self._discard()
        self.expired += 1
        return True

    def close(self) -> None:
        """Discard the open payload (its session ended): its bytes go back to the budget."""
        self._discard()

    def check_expired(self, now_ns: int) -> None:
        """Raise :class:`ChunkMissingError` if the open payload has waited too long."""
        if self._payload_id is not None and now_ns >= self._deadline_ns:
            pid, expected = self._payload_id, self._next_index
            self._discard()
            self.expired += 1
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
            self._total = total
            self._release()
            self._next_index = 0
            # the whole message must come within the timeout of its first chunk: a deadline
            # renewed by every chunk let 1-byte chunks hold the budget forever
            self._deadline_ns = now_ns + self.timeout_ns
            if self.budget is not None:
                self.budget.open += 1
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
        end = len(self._buffer) + len(body)
        if end > self._total:
            open_id = self._payload_id
            self._discard()
            raise ChunkMissingError(
                f"payload {open_id}: chunks exceed the announced length",
                payload_id=open_id,
                expected_index=index,
                got_index=index,
            )
        budget = self.budget
        full = budget.refusing(len(body)) if budget is not None else None
        if full is not None:
            open_id = self._payload_id
            self._discard()
            self.refused += 1
            self.refused_by = full
            whose = "the server's" if full.parent is None else "this client's share of"
            raise LimitExceededError(
                f"chunk {index} of payload {open_id} refused: incomplete messages already hold "
                f"{full.held} of {whose} {full.max_bytes} bytes for them ({full.option})",
                limit=full.max_bytes,
                held=full.held,
            )
        self._buffer += body
        self._next_index = index + 1
        if self._next_index < self._count:
            return None
        if len(self._buffer) != self._total:
            open_id = self._payload_id
            self._discard()
            raise ChunkMissingError(
                f"payload {open_id}: chunks are shorter than announced",
                payload_id=open_id,
                expected_index=index,
                got_index=index,
            )
        result = self._buffer  # handed over: the next payload gets a buffer of its own
        if budget is not None:
            budget.release(len(result))
            budget.open -= 1
        self._payload_id = None
        self._buffer = bytearray()
        self.completed += 1
        return result


__all__ = [
    "CHUNK_HEADER",
    "CHUNK_HEADER_LENGTH",
    "KIND_CHUNK",
    "Reassembler",
    "ReassemblyBudget",
    "is_chunk",
    "split",
    "split_parts",
]

"""The BEGIN / END markers the archive sink writes around each batch it appends to a target
recording, and how readers find the committed end of such a recording.

A marker is one unfragmented DATA frame whose header's **reserved value** is
:data:`MARKER_RESERVED_VALUE` and whose payload starts with :data:`MARKER_MAGIC`::

    magic (16 bytes) | kind u8 (1 BEGIN, 2 END) | flags u8 | insync u8 | 1 byte zero |
    partitions i32 | batch i64 | begin position i64 | rows i64 | [digest, 8 bytes] |
    identity (UTF-8, the rest)

An END marker carries a ``digest`` of the batch's frames as appended (flag 1 set: BLAKE2b, 8
bytes): two appends of one batch whose rows differ in order only (Spark running a batch again:
same rows, same sizes, so the same markers at the same positions) differ there, so a replica's
copy of the one is not taken for the other. Markers written before it have no digest (flags 0).
``insync`` is the ``minInSyncReplicas`` of the commit that wrote the marker (0 in older markers:
read as 1): a reader of the sink's whole set of archives reads a batch only once that many hold
it (:func:`~aeron_spark.connector.stores.replicas.source.in_sync_end`), i.e. once it can be
acknowledged.

``begin position`` is where the append started (the target's stop position before the BEGIN:
what a torn append is truncated back to). The sink refuses rows whose reserved value is the
marker's, so a reader (ours, or a Java ``FragmentHandler`` checking
``header.reservedValue()``) can skip markers by the reserved value alone.

Readers honour *read-committed*: a target recording's committed end is the end of its last END
marker (found by reading the recording backwards one term at a time from its end), so an append
in progress or a torn one (a BEGIN without its END) is never read. Marker frames are turned into
padding frames before decoding (:func:`mask_markers`), so positions stay those of the recording.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aeron_spark.transport.protocol.frames import (
    RESERVED_VALUE_OFFSET,
    FrameType,
    is_unfragmented,
    walk,
)

MARKER_MAGIC = b"AERON-SPARK-SINK"
MARKER_RESERVED_VALUE = int.from_bytes(b"ASPKSINK", "little")  # 0x4B4E49534B505341
BEGIN, END = 1, 2
_BODY = struct.Struct("<BBBxiqqq")  # kind, flags, insync, partitions, batch, begin, rows
_HEAD_LEN = len(MARKER_MAGIC) + _BODY.size
_HAS_DIGEST = 1  # flags: a digest follows the body
DIGEST_BYTES = 8
_TYPE_DATA, _TYPE_PAD = int(FrameType.DATA), int(FrameType.PAD)
_RESERVED_AT = RESERVED_VALUE_OFFSET
TARGET_ALIAS_PREFIX = "aeron-spark-sink-"
STAGING_ALIAS_PREFIX = "aeron-spark-stage-"


@dataclass(frozen=True, slots=True)
class Marker:
    kind: int  # BEGIN or END
    identity: str  # the sink's commit identity
    batch: int
    partitions: int
    begin_position: int
    rows: int
    position: int = -1  # where the marker frame starts in the recording (-1: not read yet)
    end_position: int = -1  # where it ends
    digest: bytes = b""  # an END's digest of the batch's frames (b"": none, an older marker)
    insync: int = 1  # the commit's minInSyncReplicas (archives that must hold the batch)

    def encode(self) -> bytes:
        if self.digest and len(self.digest) != DIGEST_BYTES:
            raise ValueError(f"a marker digest is {DIGEST_BYTES} bytes, not {len(self.digest)}")
        if not 1 <= self.insync <= 255:
            raise ValueError(f"a marker's insync is 1 to 255, not {self.insync}")
        flags = _HAS_DIGEST if self.digest else 0
        return (
            MARKER_MAGIC
            + _BODY.pack(
                self.kind,
                flags,
                self.insync,
                self.partitions,
                self.batch,
                self.begin_position,
                self.rows,
            )
            + self.digest
            + self.identity.encode()
        )

    @classmethod
    def decode(cls, payload: bytes | memoryview, position: int, end: int) -> Marker | None:
        data = bytes(payload)
        if len(data) < _HEAD_LEN or not data.startswith(MARKER_MAGIC):
            return None
        kind, flags, insync, parts, batch, begin, rows = _BODY.unpack_from(data, len(MARKER_MAGIC))
        if kind not in (BEGIN, END) or flags & ~_HAS_DIGEST:
            return None
        at = _HEAD_LEN
        digest = b""
        if flags & _HAS_DIGEST:
            if len(data) < at + DIGEST_BYTES:
                return None
            digest, at = data[at : at + DIGEST_BYTES], at + DIGEST_BYTES
        try:
            identity = data[at:].decode()
        except UnicodeDecodeError:
            return None
        return cls(kind, identity, batch, parts, begin, rows, position, end, digest, insync or 1)


def sink_hash(sink_id: str) -> str:
    """A channel-safe name of a sink id (for the ``alias`` of its recordings)."""
    return hashlib.sha256(sink_id.encode()).hexdigest()[:16]


def target_alias(sink_id: str) -> str:
    return TARGET_ALIAS_PREFIX + sink_hash(sink_id)


def is_sink_target(original_channel: str) -> bool:
    """Whether a recording is an archive sink's target (read-committed applies to it)."""
    return f"alias={TARGET_ALIAS_PREFIX}" in original_channel


# (offset, aligned length, frame length, flags, type) of each frame of whole frames: the wire
# format's walk, under the name the sink imports it by.
frames = walk


def marker_at(data: bytes | bytearray | memoryview, at: int, length: int, flags: int) -> bool:
    return (
        is_unfragmented(flags)
        and int.from_bytes(data[at + _RESERVED_AT : at + 32], "little", signed=True)
        == MARKER_RESERVED_VALUE
        and length - 32 >= _HEAD_LEN
        and bytes(data[at + 32 : at + 32 + len(MARKER_MAGIC)]) == MARKER_MAGIC
    )


def markers_in(data: bytes | bytearray | memoryview, position: int) -> list[Marker]:
    """The markers among whole frames starting at recording ``position``, in order."""
    out = []
    for at, aligned, length, flags, ftype in frames(data):
        if ftype == _TYPE_DATA and marker_at(data, at, length, flags):
            m = Marker.decode(
                memoryview(data)[at + 32 : at + length], position + at, position + at + aligned
            )
            if m is not None:
                out.append(m)
    return out


def mask_markers(data: bytes) -> tuple[bytes, int]:
    """``data`` (whole frames) with every marker frame turned into a padding frame of the same
    length (readers skip padding; positions stay the recording's); and how many were masked."""
    out: bytearray | None = None
    masked = 0
    for at, _aligned, length, flags, ftype in frames(data):
        if ftype == _TYPE_DATA and marker_at(data, at, length, flags):
            if out is None:
                out = bytearray(data)
            out[at + 6 : at + 8] = _TYPE_PAD.to_bytes(2, "little")
            masked += 1
    return (data if out is None else bytes(out)), masked


@dataclass(frozen=True, slots=True)
class Tail:
    """What the end of a target recording holds: its last marker (None: no marker at all)."""

    last: Marker | None
    end: int  # the recording's end position (stop or recorded position)

    @property
    def committed_end(self) -> int:
        """Where readers stop: after the last END; at the BEGIN's start when torn."""
        if self.last is None:
            return self.end
        if self.last.kind == END:
            return self.last.end_position
        return self.last.begin_position

    @property
    def torn(self) -> bool:
        return self.last is not None and self.last.kind == BEGIN


def read_tail(client: Any, recording_id: int, start: int, end: int, term_length: int) -> Tail:
    """The last marker of ``[start, end)`` of a recording, read backwards a term at a time (a
    term always begins with a frame): one term for a recording ending in an END marker, as many
    as the append in progress or torn spans otherwise."""
    hi = end
    while hi > start:
        lo = max(start, (hi - 1) // term_length * term_length)
        chunks = [b.data for b in client.replay(recording_id, lo, hi)]
        found = markers_in(b"".join(chunks), lo)
        if found:
            return Tail(found[-1], end)
        hi = lo
    return Tail(None, end)


def end_at(
    client: Any, recording_id: int, start: int, end: int, term_length: int, position: int
) -> Marker | None:
    """The END marker that ends exactly at ``position`` in a recording whose committed end
    ``end`` (a frame boundary) is at or past it; None when no END ends there. Read from the term
    boundary below ``position`` to the one at or after it (or ``end``): frame boundaries on any
    copy, even one that holds other bytes before ``position``, where ``position`` itself may
    fall inside a frame."""
    if position <= start or end < position:
        return None
    lo = max(start, (position - 1) // term_length * term_length)
    hi = min(end, -(-position // term_length) * term_length)
    data = b"".join(b.data for b in client.replay(recording_id, lo, hi))
    for m in markers_in(data, lo):
        if m.kind == END and m.end_position == position:
            return m
    return None


def agreed_end(
    copies: Sequence[tuple[int, Marker | None]],
    start: int,
    need: int,
    marker_at: Callable[[int, int], Marker | None],
    below: int | None = None,
) -> tuple[int, list[int]]:
    """The furthest position (``below`` at most) where ``need`` copies of a sink's target end
    a batch with the same END marker (digest included), and those copies (indices, preference
    order); ``(start, every copy)`` when there is none above ``start``.

    ``copies`` are each copy's committed end and the END marker ending there (None: not known,
    a torn tail); ``marker_at(i, position)`` reads copy ``i``'s END ending at ``position`` (or
    None). A batch is acknowledged once ``need`` archives hold its END, and the single writer
    extends a copy only after checking its END against the primary's, so copies holding the
    same END at a position hold the same bytes below it: that END is the readable end, and only
    those copies may serve it. A copy holding another batch there (an old primary back with a
    batch never acknowledged, the same size as the one acknowledged after it) does not count,
    and when no batch there is held by ``need`` copies, the next END below it (on any copy)
    is tried."""
    ends = [e for e, _ in copies]
    position = max(ends, default=start) if below is None else below
    # positions still to try: every copy's end and the begin of every END seen, kept across
    # the steps (a begin learnt high up may lie below a batch another copy spans further down)
    pending: set[int] = set()
    while position > start:
        groups: dict[Marker, list[int]] = {}
        begins: list[int] = []
        for i, (end, last) in enumerate(copies):
            if end < position:
                continue
            m = last if end == position and last is not None else marker_at(i, position)
            if m is None or m.end_position != position:
                continue
            groups.setdefault(m, []).append(i)
            begins.append(m.begin_position)
        best = max(groups.values(), key=len, default=[])
        if len(best) >= need:
            return position, best
        pending.update(ends)
        pending.update(begins)
        pending = {p for p in pending if p < position}
        position = max(pending, default=start)
    return start, list(range(len(copies)))


__all__ = [
    "BEGIN",
    "DIGEST_BYTES",
    "END",
    "MARKER_MAGIC",
    "MARKER_RESERVED_VALUE",
    "Marker",
    "STAGING_ALIAS_PREFIX",
    "TARGET_ALIAS_PREFIX",
    "Tail",
    "agreed_end",
    "end_at",
    "frames",
    "is_sink_target",
    "mask_markers",
    "markers_in",
    "read_tail",
    "sink_hash",
    "target_alias",
]

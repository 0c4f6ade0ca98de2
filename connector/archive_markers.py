"""The BEGIN / END markers the archive sink writes around each batch it appends to a target
recording, and how readers find the committed end of such a recording.

A marker is one unfragmented DATA frame whose header's **reserved value** is
:data:`MARKER_RESERVED_VALUE` and whose payload starts with :data:`MARKER_MAGIC`::

    magic (16 bytes) | kind u8 (1 BEGIN, 2 END) | flags u8 | insync u8 | 1 byte zero |
    partitions i32 | batch i64 | begin position i64 | rows i64 | [digest, 8 bytes] |
    [epoch i64 | owner i64] | identity (UTF-8, the rest)

An END marker carries a ``digest`` of the batch's frames as appended (flag 1 set: BLAKE2b, 8
bytes): two appends of one batch whose rows differ in order only (Spark running a batch again:
same rows, same sizes, so the same markers at the same positions) differ there, so a replica's
copy of the one is not taken for the other. Markers written before it have no digest (flags 0).
``insync`` is the ``minInSyncReplicas`` of the commit that wrote the marker (0 in older markers:
read as 1): a reader of the sink's whole set of archives reads a batch only once that many hold
it (:func:`~aeron_spark.connector.stores.replicas.source.in_sync_end`), i.e. once it can be
acknowledged.

``epoch`` (flag 2) is the sink's **epoch** (Kafka's leader epoch, Aeron Cluster's leadership
term) under which the marker was written and ``owner`` the archive id of the primary that wrote
it; markers written before it have none (read as epoch 0, owner 0). A sink writing to a set of
archives raises the epoch whenever its election cannot simply go on with the last one (another
primary; an archive unreachable, behind or not holding the same last END: :func:`next_epoch`),
and the new primary
first appends an **epoch opening** (flag 4: a BEGIN and an END of no rows, ``batch`` -1) and
brings ``minInSyncReplicas`` archives to it before it appends any batch under that epoch (Raft's
no-op entry at the start of a term): so every later election, which reaches at least one of
them, sees the epoch and goes above it, and the archive whose last END has the highest epoch
(then the furthest end) holds every acknowledged batch (:func:`newest`).

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

from aeron_spark.connector.errors import LimitExceededError
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
_HAS_EPOCH = 2  # flags: the epoch and its owner follow (the digest)
_OPENS_EPOCH = 4  # flags: an epoch opening (no rows), not a batch
_FLAGS = _HAS_DIGEST | _HAS_EPOCH | _OPENS_EPOCH
_EPOCH = struct.Struct("<qq")  # epoch, owner (the writing primary's archive id)
DIGEST_BYTES = 8
OPENING_BATCH = -1  # the batch of an epoch opening
MAX_EPOCH = 2**63 - 1  # an epoch is an int64
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
    epoch: int = 0  # the sink's epoch when written (0: none, an older marker)
    owner: int = 0  # the archive id of the primary that wrote it (0: none)
    opens_epoch: bool = False  # an epoch opening (no rows), not a batch

    def encode(self) -> bytes:
        if self.digest and len(self.digest) != DIGEST_BYTES:
            raise ValueError(f"a marker digest is {DIGEST_BYTES} bytes, not {len(self.digest)}")
        if not 1 <= self.insync <= 255:
            raise ValueError(f"a marker's insync is 1 to 255, not {self.insync}")
        if self.epoch < 0 or (self.opens_epoch and not self.epoch):
            raise ValueError(
                f"a marker's epoch is 0 or more (1 or more opening one), not {self.epoch}"
            )
        flags = _HAS_DIGEST if self.digest else 0
        if self.epoch:
            flags |= _HAS_EPOCH | (_OPENS_EPOCH if self.opens_epoch else 0)
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
            + (_EPOCH.pack(self.epoch, self.owner) if self.epoch else b"")
            + self.identity.encode()
        )

    @classmethod
    def decode(cls, payload: bytes | memoryview, position: int, end: int) -> Marker | None:
        data = bytes(payload)
        if len(data) < _HEAD_LEN or not data.startswith(MARKER_MAGIC):
            return None
        kind, flags, insync, parts, batch, begin, rows = _BODY.unpack_from(data, len(MARKER_MAGIC))
        if kind not in (BEGIN, END) or flags & ~_FLAGS:
            return None
        if flags & _OPENS_EPOCH and not flags & _HAS_EPOCH:
            return None
        at = _HEAD_LEN
        digest = b""
        if flags & _HAS_DIGEST:
            if len(data) < at + DIGEST_BYTES:
                return None
            digest, at = data[at : at + DIGEST_BYTES], at + DIGEST_BYTES
        epoch = owner = 0
        if flags & _HAS_EPOCH:
            if len(data) < at + _EPOCH.size:
                return None
            epoch, owner = _EPOCH.unpack_from(data, at)
            at += _EPOCH.size
            if epoch < 1:
                return None
        try:
            identity = data[at:].decode()
        except UnicodeDecodeError:
            return None
        opens = bool(flags & _OPENS_EPOCH)
        return cls(
            kind,
            identity,
            batch,
            parts,
            begin,
            rows,
            position,
            end,
            digest,
            insync or 1,
            epoch,
            owner,
            opens,
        )


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
    is tried. Where copies end a batch there with ENDs of different epochs, only those of the
    highest epoch may count (one of an older epoch was never acknowledged, see :func:`newest`)."""
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
        # a batch written under an older epoch where one under a newer epoch ends loses: the
        # newer was written by a primary elected after it, which never acknowledged it
        top = max((m.epoch for m in groups), default=0)
        best = max((g for m, g in groups.items() if m.epoch == top), key=len, default=[])
        if len(best) >= need:
            return position, best
        pending.update(ends)
        pending.update(begins)
        pending = {p for p in pending if p < position}
        position = max(pending, default=start)
    return start, list(range(len(copies)))


def newest(copies: Sequence[tuple[int, Marker | None]]) -> list[int]:
    """The copies (indices) whose history is the newest: the highest epoch of their last END,
    then the furthest committed end (Raft's "at least as up to date"); [] when no last END has
    an epoch (markers older than epochs: :func:`agreed_end` decides).

    ``copies`` are each reachable archive's committed end and the END ending there (None: no
    END). Every acknowledged batch is on such a copy as long as one archive of the
    ``minInSyncReplicas`` holding it is among ``copies``: an epoch is opened on that many
    archives before any batch is written under it, so the primary that wrote a batch
    acknowledged later (a batch run again after its first append failed) wrote it under a
    higher epoch than the failed append's, and a primary elected later either has that epoch or
    a higher one, whose opening it made only after holding every batch acknowledged before."""
    keys = [(0 if last is None else last.epoch, end) for end, last in copies]
    top = max(keys, default=(0, -1))
    if top[0] == 0:
        return []
    stray = _stray_claims(copies, top[0])
    if stray:
        keys = [(0, -1) if i in stray else key for i, key in enumerate(keys)]
        top = max(keys)
    return [i for i, key in enumerate(keys) if key == top]


def _stray_claims(copies: Sequence[tuple[int, Marker | None]], epoch: int) -> set[int]:
    """The copies whose last END claims ``epoch`` (the highest) for a primary whose claim is not
    established, where another primary's is: two primaries can number their epochs alike when
    an opening is cut off from the others before it reaches ``minInSyncReplicas`` archives (the
    primary partitioned, or the driver killed, right after appending it: it is not cut back)
    and the next primary, which never saw it, opens the same number. A claim is established
    when its last END is a batch's (written only once the opening reached that many) or its
    opening is held alike by that many of ``copies``. Before, an old primary back with such a
    stray opening after a batch never acknowledged, the promoted primary's batch run again
    being the same size, tied on epoch and end and was elected (``archive`` first): the
    acknowledged batch was cut off the others and the old one copied in its place."""
    lasts = [last for _, last in copies if last is not None and last.epoch == epoch]
    owners = {m.owner for m in lasts}
    if len(owners) < 2:
        return set()
    established = {m.owner for m in lasts if not m.opens_epoch or lasts.count(m) >= m.insync}
    if not established or established == owners:
        return set()  # nothing to tell them apart by (minInSyncReplicas 1, or too few answer)
    return {
        i
        for i, (_, last) in enumerate(copies)
        if last is not None and last.epoch == epoch and last.owner not in established
    }


def next_epoch(
    copies: Sequence[tuple[int, Marker | None]], chosen: int, owner: int
) -> tuple[int, bool]:
    """The epoch the primary ``chosen`` among ``copies`` (every archive of the sink, as
    :func:`newest` takes them; ``(-1, None)``: unreachable) writes under, and whether it must
    open it first. It goes on with the epoch of its last END only when that END is its own
    (``owner``: its archive id), of the highest epoch, and every archive holds it the same at
    the same end: then no archive holds anything of another append above it. Else (another
    primary; an archive unreachable, behind, or holding a batch not acknowledged, a copy an undo
    could not cut back) one above the highest epoch, opened before any batch: a batch run again
    never shares an epoch with an earlier append of it that an archive may still hold."""
    top = max((last.epoch for _, last in copies if last is not None), default=0)
    end, last = copies[chosen]
    if last is not None and last.epoch == top > 0 and last.owner == owner:
        if all(e == end and m == last for e, m in copies):
            return top, False
    if top >= MAX_EPOCH:
        # the sink raises its epoch by one an election: an END this high was not written by
        # it (a writer of the archive's own, or a damaged copy); before, the commit failed
        # with a bare struct.error packing the next one, at every commit
        raise LimitExceededError(
            f"archive sink: an END marker holds epoch {top}, the last an int64 takes; the "
            "sink's epochs grow by one an election, so another writer appended it: cut the "
            "copy holding it back (truncateRecording) before the sink can commit again",
            limit=MAX_EPOCH,
        )
    return top + 1, True


__all__ = [
    "BEGIN",
    "DIGEST_BYTES",
    "END",
    "MARKER_MAGIC",
    "MARKER_RESERVED_VALUE",
    "MAX_EPOCH",
    "Marker",
    "OPENING_BATCH",
    "STAGING_ALIAS_PREFIX",
    "TARGET_ALIAS_PREFIX",
    "Tail",
    "agreed_end",
    "end_at",
    "frames",
    "is_sink_target",
    "mask_markers",
    "markers_in",
    "newest",
    "next_epoch",
    "read_tail",
    "sink_hash",
    "target_alias",
]

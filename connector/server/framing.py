"""Turning payloads into Aeron DATA frames at given stream positions (for server-side recordings).

Messages published through a session, and sink batches committed by the server, are recorded
exactly as an Aeron publication would have laid them out in its log: 32-byte aligned DATA frames,
fragmented at ``mtu - 32`` bytes (BEGIN/END flags), and a PAD frame to the end of the term when
the next message does not fit in the rest of it. So a replay of a server-side recording looks the
same as a replay of a recorded Aeron publication, and readers have one code path.

Invariant (what makes a crashed commit resumable): framing is a pure function of
``(geometry, session_id, stream_id, start position, payloads, reserved values)``. Framing the
same input again yields byte-identical frames; a commit interrupted after ``k`` bytes is completed
by framing it again and appending everything after the first ``k`` bytes.

A PAD frame is emitted as its 32-byte header followed by zeros up to the end of the term, so the
recording holds every position (as a log buffer does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from aeron_spark.connector.errors import PayloadTooLargeError
from aeron_spark.transport.archive.diskio import Gathered
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DATA_HEADER_DTYPE,
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    DataFlags,
    FrameType,
)
from aeron_spark.transport.protocol.logbuffer import LogGeometry

_pack_into = DATA_HEADER.pack_into
_pack = DATA_HEADER.pack
_ZEROS = bytes(FRAME_ALIGNMENT)
_UNFRAG = int(DataFlags.UNFRAGMENTED)
_BEGIN = int(DataFlags.BEGIN)
_END = int(DataFlags.END)
_DATA = int(FrameType.DATA)
_PAD = int(FrameType.PAD)

#: In :meth:`Framer.frame_gathered`, a payload at least this long is framed as its fragments'
#: headers beside slices of it (a :class:`Gathered` block), not copied into the block.
GATHER_PAYLOAD_BYTES = 64 * 1024


class Framer:
    """Frames payloads from ``position`` on. ``frame`` yields ``(position, block)`` pairs; a block
    never crosses a term boundary and is at most ``max_block_bytes`` long (plus one message).
    ``position`` is always the end of the last frame produced (a frame boundary)."""

    def __init__(
        self,
        geometry: LogGeometry,
        session_id: int,
        stream_id: int,
        position: int,
        max_block_bytes: int = 4 * 1024 * 1024,
        reuse_blocks: bool = False,
    ) -> None:
        """``reuse_blocks``: build equal-length runs in one buffer kept between blocks (no fresh
        memory to fault in for each block); a block yielded so is only valid until the next one
        is asked for, so only a caller that writes each block out before going on may set it."""
        if position % FRAME_ALIGNMENT:
            raise ValueError(f"position {position} is not frame aligned")
        self.geometry = geometry
        self.session_id = session_id
        self.stream_id = stream_id
        self.position = position
        self.max_block_bytes = max_block_bytes
        self._max_payload = geometry.max_payload_length
        self._max_message = geometry.max_message_length
        self._reuse = reuse_blocks
        self._buffer: np.ndarray | None = None

    def check(self, payload_length: int) -> None:
        if payload_length > self._max_message:
            raise PayloadTooLargeError(
                f"message of {payload_length} bytes exceeds the stream's maximum message length "
                f"{self._max_message} (term_length / 8); split it into chunks first",
                length=payload_length,
                limit=self._max_message,
            )

    def frame(
        self,
        payloads: Iterable[bytes | bytearray | memoryview] | np.ndarray,
        reserved_values: Sequence[int] | np.ndarray | None = None,
    ) -> Iterator[tuple[int, bytes | bytearray | memoryview]]:
        """Frames of ``payloads``: a sequence of byte strings, or a 2-D uint8 array of equal-length
        payloads (one per row), which is framed with numpy; the bytes are the same either way."""
        if isinstance(payloads, np.ndarray):
            if payloads.shape[1] <= self._max_payload:
                yield from self._frame_uniform(payloads, reserved_values)
                return
            payloads = [row.tobytes() for row in payloads]  # fragmented: frame by frame
        for position, block in self._frame_each(payloads, reserved_values, False):
            assert not isinstance(block, Gathered)  # only frame_gathered makes them
            yield position, block

    def frame_gathered(
        self,
        payloads: Iterable[bytes | bytearray | memoryview],
        reserved_values: Sequence[int] | np.ndarray | None = None,
    ) -> Iterator[tuple[int, bytes | bytearray | memoryview | Gathered]]:
        """The frames of :meth:`frame`, byte for byte, but a payload of
        :data:`GATHER_PAYLOAD_BYTES` or more is not copied: its block is a :class:`Gathered`
        (its fragments' headers built apart beside slices of it, the frames before and after
        it), for a caller that writes each block with ``Recording.append`` (``os.pwritev``)
        while the payloads are alive (issue 31 item 5: a 16 MiB publish was copied whole into
        the block it was written from)."""
        return self._frame_each(payloads, reserved_values, True)  # no generator around it

    def _frame_uniform(
        self, payloads: np.ndarray, reserved_values: Sequence[int] | np.ndarray | None
    ) -> Iterator[tuple[int, bytes | bytearray | memoryview]]:
        """Equal-length unfragmented messages: whole runs of frames built as one 2-D array."""
        geometry = self.geometry
        term_length = geometry.term_length
        count, length = payloads.shape
        framed = (length + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        rvs = (
            np.zeros(count, np.int64)
            if reserved_values is None
            else np.asarray(reserved_values, dtype=np.int64)
        )
        per_block = max(1, self.max_block_bytes // framed)
        done = 0
        while done < count:
            position = self.position
            term_offset = position & (term_length - 1)
            term_index = geometry.initial_term_id + (position >> geometry.shift)
            term_id = (term_index + 2**31) % 2**32 - 2**31
            fit = (term_length - term_offset) // framed
            if fit == 0:  # PAD to the end of the term (as _frame_each does)
                pad = term_length - term_offset
                block = bytearray(pad)
                _pack_into(
                    block,
                    0,
                    pad,
                    0,
                    _UNFRAG,
                    _PAD,
                    term_offset,
                    self.session_id,
                    self.stream_id,
                    term_id,
                    0,
                )
                self.position = position + pad
                yield position, bytes(block)
                continue
            n = min(fit, per_block, count - done)
            # Every byte is written below (header fields, payload, alignment padding), so the
            # block is not zeroed first: that would touch every byte once more.
            frames = self._block(n * framed).reshape(n, framed)
            header = frames[:, :DATA_HEADER_LENGTH].view(DATA_HEADER_DTYPE)[:, 0]
            header["length"] = length + DATA_HEADER_LENGTH
            header["version"] = 0
            header["flags"] = _UNFRAG
            header["type"] = _DATA
            header["term_offset"] = term_offset + np.arange(n, dtype=np.int64) * framed
            header["session_id"] = self.session_id
            header["stream_id"] = self.stream_id
            header["term_id"] = term_id
            header["reserved_value"] = rvs[done : done + n]
            frames[:, DATA_HEADER_LENGTH : DATA_HEADER_LENGTH + length] = payloads[done : done + n]
            frames[:, DATA_HEADER_LENGTH + length :] = 0
            done += n
            self.position = position + n * framed
            yield position, frames.reshape(-1).data  # bytes-like, not copied

    def _block(self, size: int) -> np.ndarray:
        """``size`` bytes of uninitialised memory for a block (see ``reuse_blocks``)."""
        if not self._reuse:
            return np.empty(size, dtype=np.uint8)
        if self._buffer is None or len(self._buffer) < size:
            # as long as the blocks asked for (twice the last, up to max_block_bytes, when a
            # longer one comes), not max_block_bytes at once: a commit of a few small rows
            # allocated 4 MiB
            grown = 0 if self._buffer is None else min(2 * len(self._buffer), self.max_block_bytes)
            self._buffer = np.empty(max(size, grown), dtype=np.uint8)
        return self._buffer[:size]

    def _frame_each(
        self,
        payloads: Iterable[bytes | bytearray | memoryview],
        reserved_values: Sequence[int] | np.ndarray | None,
        gather: bool,
    ) -> Iterator[tuple[int, bytes | bytearray | memoryview | Gathered]]:
        geometry = self.geometry
        term_length = geometry.term_length
        shift = geometry.shift
        initial = geometry.initial_term_id
        max_payload, max_message = self._max_payload, self._max_message
        session_id, stream_id = self.session_id, self.stream_id
        block = bytearray()
        block_start = self.position
        position = self.position
        # gather: the parts of the block before ``block`` (a large payload's frames as headers
        # and slices of it) and their bytes; ``block`` is then the part after them
        gathered: list[bytes | bytearray | memoryview] = []
        gathered_bytes = 0
        gather_from = GATHER_PAYLOAD_BYTES if gather else -1
        for index, payload in enumerate(payloads):
            length = len(payload)
            if length > max_message:
                self.check(length)  # raises
            rv = reserved_values[index] if reserved_values is not None else 0
            framed = (
                geometry.framed_length(length)
                if length > max_payload
                else ((length + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT)
            )
            term_offset = position & (term_length - 1)
            if term_offset + framed > term_length:
                # PAD to the end of the term; the term ends the block.
                pad = term_length - term_offset
                term_id = (initial + (position >> shift) + 2**31) % 2**32 - 2**31
                start = len(block)
                block += bytes(pad)
                _pack_into(
                    block,
                    start,
                    pad,
                    0,
                    _UNFRAG,
                    _PAD,
                    term_offset,
                    session_id,
                    stream_id,
                    term_id,
                    0,
                )
                position += pad
                yield block_start, _block(gathered, gathered_bytes, block)  # no copy
                block, gathered, gathered_bytes = bytearray(), [], 0
                block_start = position
                term_offset = 0
            elif (block or gathered) and (
                len(block) + gathered_bytes >= self.max_block_bytes or term_offset == 0
            ):
                # full, or the last message ended exactly at the end of its term
                yield block_start, _block(gathered, gathered_bytes, block)  # no copy
                block, gathered, gathered_bytes = bytearray(), [], 0
                block_start = position
            term_id = (initial + (position >> shift) + 2**31) % 2**32 - 2**31
            if length <= max_payload:
                # hot path (most messages): header, payload, alignment zeros appended in place
                block += _pack(
                    length + DATA_HEADER_LENGTH,
                    0,
                    _UNFRAG,
                    _DATA,
                    term_offset,
                    session_id,
                    stream_id,
                    term_id,
                    rv,
                )
                block += payload
                block += _ZEROS[: framed - DATA_HEADER_LENGTH - length]
            elif 0 <= gather_from <= length:
                # a large payload (frame_gathered): its fragments' headers beside slices of
                # it, the block so far before them, nothing of the payload copied
                if block:
                    gathered.append(block)
                    gathered_bytes += len(block)
                    block = bytearray()
                view = memoryview(payload)
                if view.ndim != 1 or view.itemsize != 1:
                    view = view.cast("B")
                self._fragments(gathered.append, view, length, term_offset, term_id, rv)
                gathered_bytes += framed
            else:
                # a fragmented message: its fragments appended in place, like the hot path's
                # frames, to the block holding the messages before it (one write for many
                # large messages, not one each)
                self._fragments(block.extend, memoryview(payload), length, term_offset, term_id, rv)
            position += framed
            self.position = position
        if block or gathered:
            yield block_start, _block(gathered, gathered_bytes, block)  # no copy
        self.position = position

    def _fragments(
        self,
        append: Callable[[bytes | memoryview], object],
        view: memoryview,
        length: int,
        term_offset: int,
        term_id: int,
        reserved_value: int,
    ) -> None:
        """The fragments of the message ``view`` (``length`` bytes, more than the maximum
        payload) framed from ``term_offset``, BEGIN on the first and END on the last, given to
        ``append`` part by part: each one's header, payload slice and alignment zeros (when there
        are any). The block's ``extend`` copies them in; a gathered block's ``append`` keeps
        them apart. Every fragment but the last is a full one (its sizes worked out once)."""
        session_id, stream_id = self.session_id, self.stream_id
        chunk = self._max_payload
        aligned = (chunk + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        zeros = _ZEROS[: aligned - DATA_HEADER_LENGTH - chunk]
        flags = _BEGIN
        offset = term_offset
        consumed = 0
        while consumed < length:
            if length - consumed <= chunk:  # the last fragment
                chunk = length - consumed
                flags |= _END
                aligned = (chunk + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                zeros = _ZEROS[: aligned - DATA_HEADER_LENGTH - chunk]
            append(
                _pack(
                    chunk + DATA_HEADER_LENGTH,
                    0,
                    flags,
                    _DATA,
                    offset,
                    session_id,
                    stream_id,
                    term_id,
                    reserved_value,
                )
            )
            append(view[consumed : consumed + chunk])
            if zeros:
                append(zeros)
            flags = 0
            offset += aligned
            consumed += chunk


def _block(
    gathered: list[bytes | bytearray | memoryview], gathered_bytes: int, block: bytearray
) -> bytearray | Gathered:
    """A block of ``_frame_each``: ``block`` alone, or the gathered parts and ``block`` after
    them as one :class:`Gathered` block."""
    if not gathered:
        return block
    if block:
        gathered.append(block)
    return Gathered(gathered, gathered_bytes + len(block))


__all__ = ["GATHER_PAYLOAD_BYTES", "Framer"]

"""Term-level operations on a log buffer: append, read, rebuild, scan for gaps, scan for sending.

These work on any writable buffer (``bytearray`` for UDP publications and images,
``mmap`` for IPC), through a ``memoryview`` of one term partition. They hold no clock and do no
I/O. The only ordering rule that matters across threads or processes is Aeron's: a frame becomes
visible to readers when its ``frame_length`` field is written, so every writer here writes
``frame_length`` last, and every reader stops at the first ``frame_length <= 0``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DATA_HEADER_IDS,
    DATA_HEADER_LENGTH,
    DATA_HEADER_TAIL,
    FRAME_ALIGNMENT,
    DataFlags,
    FrameType,
    uniform_ids_into,
    uniform_run,
)
from aeron_spark.transport.protocol.logbuffer import LogGeometry, wrap_int32

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_i32_from = _I32.unpack_from
_i32_into = _I32.pack_into
_tail_into = DATA_HEADER_TAIL.pack_into  # the header after frame_length, which is written last
_ids_into = DATA_HEADER_IDS.pack_into  # the header fields a block append rewrites (at 8)
_u16_from = struct.Struct("<H").unpack_from

_FLAG_BEGIN = int(DataFlags.BEGIN)
_FLAG_END = int(DataFlags.END)
_FLAG_UNFRAGMENTED = int(DataFlags.UNFRAGMENTED)
_TYPE_PAD = int(FrameType.PAD)
_TYPE_DATA = int(FrameType.DATA)

_UNIFORM_BLOCK_FRAMES = 16  # from here a block of equal-length frames is rewritten with numpy
_ZERO_PIECE = 1024 * 1024
_ZEROS = memoryview(bytes(_ZERO_PIECE))


def zero_fill(view: memoryview) -> None:
    """Set every byte of ``view`` to zero (terms are cleaned before reuse), a piece of at most
    1 MiB at a time: a zeroed copy of each term size, kept for the process's life, made an
    8 MiB session term cost 8 MiB more on its first rotation."""
    n = len(view)
    for offset in range(0, n, _ZERO_PIECE):
        end = min(offset + _ZERO_PIECE, n)
        view[offset:end] = _ZEROS[: end - offset]


class Header:
    """A reusable view of the DATA header of the fragment being delivered.

    Like Aeron's ``Header`` flyweight it is only valid inside the handler call that received it.
    """

    __slots__ = ("buffer", "offset", "initial_term_id", "shift", "term_length")

    def __init__(self, initial_term_id: int, shift: int) -> None:
        self.buffer: memoryview = memoryview(b"")
        self.offset = 0
        self.initial_term_id = initial_term_id
        self.shift = shift
        self.term_length = 1 << shift

    @property
    def frame_length(self) -> int:
        return _i32_from(self.buffer, self.offset)[0]

    @property
    def flags(self) -> int:
        return self.buffer[self.offset + 5]

    @property
    def frame_type(self) -> int:
        return _I32.unpack_from(self.buffer, self.offset + 4)[0] >> 16

    @property
    def term_offset(self) -> int:
        return _i32_from(self.buffer, self.offset + 8)[0]

    @property
    def session_id(self) -> int:
        return _i32_from(self.buffer, self.offset + 12)[0]

    @property
    def stream_id(self) -> int:
        return _i32_from(self.buffer, self.offset + 16)[0]

    @property
    def term_id(self) -> int:
        return _i32_from(self.buffer, self.offset + 20)[0]

    @property
    def reserved_value(self) -> int:
        return _I64.unpack_from(self.buffer, self.offset + 24)[0]

    @property
    def position(self) -> int:
        """Position just past this fragment (its aligned end), as Aeron's ``Header.position()``."""
        length = _i32_from(self.buffer, self.offset)[0]
        end = self.term_offset + ((length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT)
        return (wrap_int32(self.term_id - self.initial_term_id) << self.shift) + end

    @property
    def fragment_position(self) -> int:
        """Position of the start of this fragment."""
        return (wrap_int32(self.term_id - self.initial_term_id) << self.shift) + self.term_offset


FragmentHandler = Callable[[memoryview, Header], object]


class TermAppender:
    """Appends messages to a log buffer as a single writer (Aeron's ``ExclusiveTermAppender``).

    Keeps the tail (term id and offset) in Python attributes; ``position`` is the end of the last
    complete frame, so a reader limited by it never sees a partly written frame. Messages longer
    than ``mtu - 32`` are fragmented (BEGIN on the first fragment, END on the last). A message that
    does not fit in the rest of the term is preceded by a PAD frame to the end of the term and
    goes at offset 0 of the next term, which is zeroed first.
    """

    __slots__ = (
        "geometry",
        "terms",
        "session_id",
        "stream_id",
        "term_id",
        "term_offset",
        "partition",
        "term_length",
        "max_payload",
        "max_message",
        "position",
        "on_rotate",
        "clean_on_rotate",
    )

    def __init__(
        self,
        geometry: LogGeometry,
        terms: list[memoryview],
        session_id: int,
        stream_id: int,
        term_id: int,
        term_offset: int,
    ) -> None:
        self.geometry = geometry
        self.terms = terms
        self.session_id = session_id
        self.stream_id = stream_id
        self.term_id = term_id
        self.term_offset = term_offset
        self.term_length = geometry.term_length
        self.partition = wrap_int32(term_id - geometry.initial_term_id) % 3
        self.max_payload = geometry.max_payload_length
        self.max_message = geometry.max_message_length
        self.position = geometry.position(term_id, term_offset)
        self.on_rotate: Callable[[int, int], None] | None = None
        # False when the owner cleans terms ahead itself (IPC: readers share the terms)
        self.clean_on_rotate = True

    def append(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message; returns the new position. Caller checks limits first."""
        length = len(payload)
        if length <= self.max_payload:
            aligned = (length + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if self.term_offset + aligned > self.term_length:
                self.pad_and_rotate()
            term = self.terms[self.partition]
            offset = self.term_offset
            start = offset + DATA_HEADER_LENGTH
            term[start : start + length] = payload
            _tail_into(
                term,
                offset + 4,
                0,
                _FLAG_UNFRAGMENTED,
                _TYPE_DATA,
                offset,
                self.session_id,
                self.stream_id,
                self.term_id,
                reserved_value,
            )
            _i32_into(term, offset, length + DATA_HEADER_LENGTH)
            self.term_offset = offset + aligned
            self.position += aligned
            return self.position
        return self._append_fragmented(payload, length, reserved_value)

    def _append_fragmented(
        self, payload: bytes | bytearray | memoryview, length: int, reserved_value: int
    ) -> int:
        required = self.geometry.framed_length(length)
        if self.term_offset + required > self.term_length:
            self.pad_and_rotate()
        term = self.terms[self.partition]
        offset = self.term_offset
        view = memoryview(payload)
        remaining = length
        consumed = 0
        max_payload = self.max_payload
        # Write every fragment's body and header but the first fragment's frame_length last,
        # so a reader sees the whole message or none of it.
        first_offset = offset
        first_length = 0
        while remaining > 0:
            chunk = max_payload if remaining > max_payload else remaining
            flags = 0
            if consumed == 0:
                flags |= _FLAG_BEGIN
            if chunk == remaining:
                flags |= _FLAG_END
            start = offset + DATA_HEADER_LENGTH
            term[start : start + chunk] = view[consumed : consumed + chunk]
            _tail_into(
                term,
                offset + 4,
                0,
                flags,
                _TYPE_DATA,
                offset,
                self.session_id,
                self.stream_id,
                self.term_id,
                reserved_value,
            )
            if consumed == 0:
                first_length = chunk + DATA_HEADER_LENGTH
            else:
                _i32_into(term, offset, chunk + DATA_HEADER_LENGTH)
            offset += (chunk + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            consumed += chunk
            remaining -= chunk
        _i32_into(term, first_offset, first_length)
        self.position += offset - self.term_offset
        self.term_offset = offset
        return self.position

    def append_block(self, block: bytes | bytearray | memoryview) -> int:
        """Append a block of whole, already framed fragments (Aeron's
        ``ExclusiveTermAppender.appendBlock``); returns the new position. Caller checks limits
        and rotates a full term first.

        The block must fit in the rest of the current term (a block never spans a term end),
        be a multiple of the frame alignment, and hold whole frames, the first one DATA (later
        ones DATA or PAD). Each frame's term offset, session, stream and term id are rewritten
        to this log's. The first frame's ``frame_length`` is written last, so a reader sees the
        whole block or none of it. A malformed block raises :class:`LocalProtocolError` and
        leaves the term as it was.
        """
        view = memoryview(block)
        length = len(view)
        offset = self.term_offset
        if length <= 0 or length % FRAME_ALIGNMENT:
            raise LocalProtocolError(
                f"block length {length} is not a positive multiple of {FRAME_ALIGNMENT}"
            )
        if offset + length > self.term_length:
            raise LocalProtocolError(
                f"block of {length} bytes does not fit the {self.term_length - offset} bytes "
                f"left in term {self.term_id} (a block cannot span a term end)"
            )
        first_length = _i32_from(view, 0)[0]
        end = offset + length
        term = self.terms[self.partition]
        session_id, stream_id, term_id = self.session_id, self.stream_id, self.term_id
        aligned = (first_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        frames = length // aligned if first_length >= DATA_HEADER_LENGTH else 0
        if (
            frames >= _UNIFORM_BLOCK_FRAMES
            and frames * aligned == length
            and uniform_run(view, 0, first_length, unfragmented=False) == frames
        ):  # equal-length DATA frames (fixed-size rows): the ids rewritten at once
            term[offset + 4 : end] = view[4:]
            uniform_ids_into(term, offset, frames, aligned, session_id, stream_id, term_id)
            _i32_into(term, offset, first_length)
            self.term_offset = end
            self.position += length
            return self.position
        term[offset + 4 : end] = view[4:]  # the first frame_length stays 0: nobody reads on
        at, frame_length = offset, first_length
        while True:
            frame_type = _u16_from(term, at + 6)[0]
            aligned = (frame_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if (
                frame_length < DATA_HEADER_LENGTH
                or at + aligned > end
                or (frame_type != _TYPE_DATA and (frame_type != _TYPE_PAD or at == offset))
            ):
                zero_fill(term[offset + 4 : end])
                raise LocalProtocolError(
                    f"block holds a bad frame at byte {at - offset}: length {frame_length}, "
                    f"type {frame_type} (whole DATA frames, the first one DATA, expected)"
                )
            _ids_into(term, at + 8, at, session_id, stream_id, term_id)
            at += aligned
            if at == end:
                break
            frame_length = _i32_from(term, at)[0]
        _i32_into(term, offset, first_length)
        self.term_offset = end
        self.position += length
        return self.position

    def pad_and_rotate(self) -> None:
        """PAD the rest of the term and go on at offset 0 of the next (zeroed unless the owner
        cleans terms itself)."""
        term = self.terms[self.partition]
        offset = self.term_offset
        pad_length = self.term_length - offset
        if pad_length > 0:
            _tail_into(
                term,
                offset + 4,
                0,
                _FLAG_UNFRAGMENTED,
                _TYPE_PAD,
                offset,
                self.session_id,
                self.stream_id,
                self.term_id,
                0,
            )
            _i32_into(term, offset, pad_length)
            self.position += pad_length
        self.term_id = wrap_int32(self.term_id + 1)
        self.partition = (self.partition + 1) % 3
        self.term_offset = 0
        if self.clean_on_rotate:
            zero_fill(self.terms[self.partition])
        if self.on_rotate is not None:
            self.on_rotate(self.term_id, self.partition)

    def required_length(self, message_length: int) -> int:
        """Position delta the next append of ``message_length`` bytes can cause (with padding)."""
        framed = (
            (message_length + DATA_HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if message_length <= self.max_payload
            else self.geometry.framed_length(message_length)
        )
        if self.term_offset + framed > self.term_length:
            return self.term_length - self.term_offset + framed
        return framed


def read_term(
    term: memoryview,
    term_offset: int,
    handler: FragmentHandler,
    fragment_limit: int,
    header: Header,
    limit_offset: int | None = None,
) -> tuple[int, int]:
    """Deliver complete frames from ``term_offset`` to ``handler`` (Aeron's ``TermReader.read``).

    Stops at the first frame whose length is not yet written, at ``limit_offset`` (default: end of
    term), or after ``fragment_limit`` DATA fragments. PAD frames are skipped, not delivered.
    Returns ``(fragments_read, new_term_offset)``.
    """
    end = len(term) if limit_offset is None else limit_offset
    fragments = 0
    offset = term_offset
    header.buffer = term
    while fragments < fragment_limit and offset < end:
        length = _i32_from(term, offset)[0]
        if length <= 0:
            break
        frame_offset = offset
        offset += (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        if term[frame_offset + 6] == _TYPE_PAD:
            continue
        header.offset = frame_offset
        fragments += 1
        handler(term[frame_offset + DATA_HEADER_LENGTH : frame_offset + length], header)
    return fragments, offset


def insert_packet(term: memoryview, term_offset: int, packet: memoryview | bytes) -> None:
    """Copy a received datagram of DATA/PAD frames into ``term`` at ``term_offset``.

    As Aeron's ``TermRebuilder.insert``: nothing happens if a frame is already there (duplicates
    are idempotent); otherwise the first frame's length field is written after everything else.
    """
    if _i32_from(term, term_offset)[0] != 0:
        return
    length = len(packet)
    term[term_offset + 4 : term_offset + length] = packet[4:length]
    term[term_offset : term_offset + 4] = packet[0:4]


def scan_for_gap(
    term: memoryview,
    rebuild_offset: int,
    hwm_offset: int,
    next_frame_offset: Callable[[int], int],
) -> tuple[int, int, int]:
    """Find the first gap in ``[rebuild_offset, hwm_offset)`` (Aeron's ``TermGapScanner``).

    Walks frame headers from ``rebuild_offset`` (one read per frame). A gap starts at the first
    unwritten frame and ends where the next received datagram starts: ``next_frame_offset(o)``
    names the first offset after ``o`` where one was inserted (the image keeps that index), so
    the cost is one step per frame and one call per gap, never one per 32 bytes of empty term.
    Returns ``(new_rebuild_offset, gap_offset, gap_length)``; ``gap_length`` is 0 when the range
    is complete up to ``hwm_offset``. ``new_rebuild_offset`` is the end of the contiguous frames.
    """
    offset = rebuild_offset
    while offset < hwm_offset:
        length = _i32_from(term, offset)[0]
        if length <= 0:
            break
        offset += (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
    if offset >= hwm_offset:
        return offset, 0, 0
    end = next_frame_offset(offset)
    if end <= offset:
        end = offset + FRAME_ALIGNMENT
    return offset, offset, min(end, hwm_offset) - offset


def scan_for_send(term: memoryview, term_offset: int, max_bytes: int, mtu: int) -> tuple[int, int]:
    """How many bytes from ``term_offset`` to put in the next datagram (Aeron's ``TermScanner``).

    Takes whole frames while they fit in ``min(max_bytes, mtu)``. A PAD frame ends the datagram:
    only its 32-byte header is sent, but the position advances over the whole padding.
    Returns ``(bytes_to_send, bytes_to_advance)``; (0, 0) when nothing fits.
    """
    limit = max_bytes if max_bytes < mtu else mtu
    available = 0
    offset = term_offset
    while available < limit:
        length = _i32_from(term, offset)[0]
        if length <= 0:
            break
        if term[offset + 6] == _TYPE_PAD:
            if available == 0:
                return DATA_HEADER_LENGTH, (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            break
        aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        if available + aligned > limit:
            break
        available += aligned
        offset += aligned
    return available, available


def encode_data_header(
    frame_length: int,
    flags: int,
    frame_type: int,
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    reserved_value: int = 0,
) -> bytes:
    """A 32-byte DATA/PAD header (heartbeats use frame_length 0)."""
    return DATA_HEADER.pack(
        frame_length,
        0,
        flags,
        frame_type,
        term_offset,
        session_id,
        stream_id,
        term_id,
        reserved_value,
    )


class FragmentAssemblerHandler(Protocol):
    def __call__(self, payload: memoryview, header: Header) -> object: ...


class FragmentAssembler:
    """Reassembles fragmented messages before handing them to ``delegate`` (Aeron's class).

    Unfragmented messages pass straight through. Fragments of one session are buffered until the
    END fragment; a BEGIN arriving while a message is open discards the open one (the publisher
    died mid-message), so a torn message is never delivered.
    """

    def __init__(self, delegate: FragmentAssemblerHandler, initial_capacity: int = 4096) -> None:
        self.delegate = delegate
        self._buffers: dict[int, bytearray] = {}
        self.discarded_messages = 0
        self._initial_capacity = initial_capacity

    def __call__(self, payload: memoryview, header: Header) -> None:
        flags = header.flags
        if flags & _FLAG_UNFRAGMENTED == _FLAG_UNFRAGMENTED:
            self.delegate(payload, header)
            return
        session_id = header.session_id
        if flags & _FLAG_BEGIN:
            if session_id in self._buffers:
                self.discarded_messages += 1
            self._buffers[session_id] = bytearray(payload)
            return
        buf = self._buffers.get(session_id)
        if buf is None:
            return  # a middle or END fragment without its BEGIN: joined mid-message
        buf += payload
        if flags & _FLAG_END:
            del self._buffers[session_id]
            self.delegate(memoryview(buf), header)

    def free_session(self, session_id: int) -> None:
        """Drop a partly assembled message of a session whose image went away."""
        if self._buffers.pop(session_id, None) is not None:
            self.discarded_messages += 1

"""Codecs for Aeron's UDP frames (protocol version 0), one per frame type.

Every multi-byte field is little-endian. Each frame starts with the common 8-byte header::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                         Frame Length                          |
    +---------------+---------------+-------------------------------+
    |    Version    |     Flags     |             Type              |
    +---------------+---------------+-------------------------------+

Frame layouts follow ``aeron_udp_protocol.h`` of real-logic/aeron 1.47.3 (see
``shared/reference/aeron-wire.md``). Every ``decode`` has an ``encode`` that gives back the same
bytes; the captured vectors in ``transport/tests/data/aeron-vectors.json`` check both.

Decoding never raises anything but :class:`InvalidFrameError` on bad input.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from aeron_spark.transport.errors import InvalidFrameError

Buffer = bytes | bytearray | memoryview

FRAME_ALIGNMENT = 32
HEADER_LENGTH = 8
DATA_HEADER_LENGTH = 32
# A data frame's header as a numpy record (little-endian, DATA_HEADER_LENGTH bytes): for reading
# the headers of a whole block of frames at once (replay, framing, the connector's formats).
DATA_HEADER_DTYPE = np.dtype(
    [
        ("length", "<i4"),
        ("version", "u1"),
        ("flags", "u1"),
        ("type", "<i2"),
        ("term_offset", "<i4"),
        ("session_id", "<i4"),
        ("stream_id", "<i4"),
        ("term_id", "<i4"),
        ("reserved_value", "<i8"),
    ]
)
SETUP_LENGTH = 40
SM_LENGTH = 36
SM_WITH_GROUP_TAG_LENGTH = 44
NAK_LENGTH = 28
RTTM_LENGTH = 40
ERR_HEADER_LENGTH = 40
ERR_MAX_TEXT_LENGTH = 1023
RSP_SETUP_LENGTH = 20
CURRENT_VERSION = 0


class FrameType(enum.IntEnum):
    PAD = 0x00
    DATA = 0x01
    NAK = 0x02
    SM = 0x03
    ERR = 0x04
    SETUP = 0x05
    RTTM = 0x06
    RES = 0x07
    ATS_DATA = 0x08
    RSP_SETUP = 0x0B
    EXT = -1


class DataFlags(enum.IntFlag):
    BEGIN = 0x80
    END = 0x40
    EOS = 0x20
    UNFRAGMENTED = 0xC0


class SmFlags(enum.IntFlag):
    SEND_SETUP = 0x80
    EOS = 0x40


class SetupFlags(enum.IntFlag):
    SEND_RESPONSE_SETUP = 0x80
    GROUP = 0x40


RTTM_REPLY_FLAG = 0x80  # set on a *request*: "please reply"
ERR_GROUP_TAG_FLAG = 0x08

# Precompiled layouts. "<" = little-endian, no padding.
HEADER = struct.Struct("<iBBh")
DATA_HEADER = struct.Struct("<iBBhiiiiq")
SETUP = struct.Struct("<iBBhiiiiiiii")
SM = struct.Struct("<iBBhiiiiiq")
SM_GROUP_TAG = struct.Struct("<q")
NAK = struct.Struct("<iBBhiiiii")
RTTM = struct.Struct("<iBBhiiqqq")
ERR = struct.Struct("<iBBhiiqqii")
RSP_SETUP = struct.Struct("<iBBhiii")
# Prefixes and parts of the layouts above, for walks and writers that touch some fields only.
FRAME_HEAD = struct.Struct("<iBBhi")  # frame_length, version, flags, type, term_offset
DATA_HEADER_TAIL = struct.Struct("<BBhiiiiq")  # DATA_HEADER after frame_length (written first)
DATA_HEADER_IDS = struct.Struct("<iiii")  # term_offset, session_id, stream_id, term_id (at 8)
SETUP_PEEK = struct.Struct("<ii8xii")  # SETUP from 12: session, stream, term_length, mtu
# Bytes 4..8 of a header (version, flags, type) as one little-endian int32, for numpy walks.
_UNFRAGMENTED = int(DataFlags.UNFRAGMENTED)
_TYPE_FLAGS_WORD_MASK = ~(0xFF << 8)  # everything but the flags byte
DATA_WORD = int(FrameType.DATA) << 16
UNFRAGMENTED_DATA_WORD = int(DataFlags.UNFRAGMENTED) << 8 | DATA_WORD

# Field offsets used by hot paths that read single fields in place.
FRAME_LENGTH_OFFSET = 0
VERSION_OFFSET = 4
FLAGS_OFFSET = 5
TYPE_OFFSET = 6
TERM_OFFSET_OFFSET = 8
SESSION_ID_OFFSET = 12
STREAM_ID_OFFSET = 16
TERM_ID_OFFSET = 20
RESERVED_VALUE_OFFSET = 24


def align(value: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round ``value`` up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & -alignment


def is_unfragmented(flags: int) -> bool:
    """Whether a DATA frame's flags mark a whole message (BEGIN and END)."""
    return flags & _UNFRAGMENTED == _UNFRAGMENTED


def walk(data: Buffer) -> Iterator[tuple[int, int, int, int, int]]:
    """``(offset, aligned length, frame length, flags, type)`` of each frame of a run of whole
    frames from offset 0, up to the first ``frame_length <= 0`` or the last whole header."""
    at, size = 0, len(data)
    head = HEADER.unpack_from
    while at + DATA_HEADER_LENGTH <= size:
        length, _version, flags, ftype = head(data, at)
        if length <= 0:
            break
        aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        yield at, aligned, length, flags, ftype & 0xFFFF
        at += aligned


def uniform_run(
    data: Buffer | np.ndarray,
    offset: int,
    frame_length: int,
    *,
    unfragmented: bool = True,
    max_frames: int | None = None,
) -> int:
    """How many frames from ``offset`` (a frame boundary) are DATA frames of protocol version 0
    and exactly ``frame_length`` bytes, each whole message (BEGIN and END flags) unless
    ``unfragmented=False``: the run that readers, scans and recorders take at once with numpy
    (streams of equal-length messages are the common case; a frame costs about a microsecond
    when walked in Python). At most ``max_frames``; 0 for a ``frame_length`` below the header."""
    if frame_length < DATA_HEADER_LENGTH:
        return 0
    aligned = (frame_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
    size = data.nbytes if isinstance(data, np.ndarray | memoryview) else len(data)
    count = (size - offset) // aligned
    if max_frames is not None:
        count = min(count, max_frames)
    if count <= 0:
        return 0
    # Windows that double (16, 32, 64 ... frames) stop at the first mismatch: a run costs what
    # its own frames cost, never the rest of the block (one window over the whole rest made a
    # block of messages of varying lengths quadratic: test_attack_scan_cost.py).
    done = 0
    window = _FIRST_WINDOW
    while done < count:
        n = min(window, count - done)
        words = np.frombuffer(
            data, dtype="<i4", count=n * aligned // 4, offset=offset + done * aligned
        ).reshape(n, aligned // 4)
        if unfragmented:
            ok = (words[:, 0] == frame_length) & (words[:, 1] == UNFRAGMENTED_DATA_WORD)
        else:
            ok = (words[:, 0] == frame_length) & (
                (words[:, 1] & _TYPE_FLAGS_WORD_MASK) == DATA_WORD
            )
        if not ok.all():
            return done + int(np.argmin(ok))
        done += n
        window *= 2
    return done


_FIRST_WINDOW = 16  # frames uniform_run compares at first


def uniform_ids_into(
    buffer: Buffer,
    offset: int,
    frames: int,
    aligned: int,
    session_id: int,
    stream_id: int,
    term_id: int,
) -> None:
    """Write the ids of ``frames`` equal-length frames (``aligned`` bytes each) from ``offset``
    of ``buffer`` at once with numpy: each frame's term offset (its own offset in the buffer,
    a term), session, stream and term id; nothing else of the headers (``frame_length`` least
    of all: the caller writes the first one last). The block append of a run of equal-length
    frames (:func:`uniform_run`), which a frame-by-frame walk costs ~7 us per frame."""
    words = np.frombuffer(buffer, dtype="<i4", count=frames * aligned // 4, offset=offset)
    rows = words.reshape(frames, aligned // 4)
    rows[:, TERM_OFFSET_OFFSET // 4] = np.arange(offset, offset + frames * aligned, aligned)
    rows[:, SESSION_ID_OFFSET // 4] = session_id
    rows[:, STREAM_ID_OFFSET // 4] = stream_id
    rows[:, TERM_ID_OFFSET // 4] = term_id


def uniform_block(data: Buffer | np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A block that is only equal-length whole-message DATA frames (:func:`uniform_run` over all
    of it) as ``(headers, payloads)``: the headers as a :data:`DATA_HEADER_DTYPE` array (a copy),
    the payloads as a ``(frames, payload length)`` uint8 view strided over the block. None for
    any other block (the caller then walks it frame by frame)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    size = len(raw)
    if size < DATA_HEADER_LENGTH:
        return None
    length = int(raw[:4].view("<i4")[0])
    if length < DATA_HEADER_LENGTH:
        return None
    aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
    if size % aligned or uniform_run(raw, 0, length) != size // aligned:
        return None
    rows = raw.reshape(-1, aligned)
    headers = np.ascontiguousarray(rows[:, :DATA_HEADER_LENGTH]).view(DATA_HEADER_DTYPE).ravel()
    return headers, rows[:, DATA_HEADER_LENGTH:length]


@dataclass(frozen=True, slots=True)
class DataFrame:
    """DATA (type 0x01) or PAD (type 0x00) frame; 32-byte header, then the payload.

    ::

        0  frame_length i32 | 4 version u8 | 5 flags u8 | 6 type i16
        8  term_offset i32
        12 session_id i32
        16 stream_id i32
        20 term_id i32
        24 reserved_value i64
        32 payload ...

    ``frame_length`` = 32 + payload length (not aligned); 0 marks a heartbeat. A PAD frame's
    ``frame_length`` covers the rest of the term though only its header is sent, so for PAD the
    payload is empty and ``frame_length`` is kept as given.
    """

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    payload: bytes = b""
    flags: int = DataFlags.UNFRAGMENTED
    reserved_value: int = 0
    frame_type: int = FrameType.DATA
    frame_length: int | None = None  # None: computed as 32 + len(payload)
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.DATA

    @property
    def length(self) -> int:
        if self.frame_length is not None:
            return self.frame_length
        return DATA_HEADER_LENGTH + len(self.payload)

    @property
    def is_heartbeat(self) -> bool:
        return self.frame_type == FrameType.DATA and self.length == 0

    @property
    def is_eos(self) -> bool:
        return bool(self.flags & DataFlags.EOS)

    def encode(self, *, pad_to_alignment: bool = True) -> bytes:
        header = DATA_HEADER.pack(
            self.length,
            self.version,
            self.flags,
            self.frame_type,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.reserved_value,
        )
        body = header + self.payload
        if pad_to_alignment and self.frame_type == FrameType.DATA:
            body += bytes(align(len(body)) - len(body))
        return body

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> DataFrame:
        if len(buf) - offset < DATA_HEADER_LENGTH:
            raise InvalidFrameError(
                f"DATA frame needs {DATA_HEADER_LENGTH} bytes, got {len(buf) - offset}"
            )
        (length, version, flags, ftype, term_offset, session_id, stream_id, term_id, reserved) = (
            DATA_HEADER.unpack_from(buf, offset)
        )
        _check_version(version)
        if ftype not in (FrameType.DATA, FrameType.PAD):
            raise InvalidFrameError(f"frame type {ftype:#x} is not DATA or PAD")
        if length < 0:
            raise InvalidFrameError(f"negative frame_length {length}")
        if ftype == FrameType.PAD:
            payload = b""
        elif length == 0:
            payload = b""
        else:
            if length < DATA_HEADER_LENGTH:
                raise InvalidFrameError(f"DATA frame_length {length} below header length 32")
            end = offset + length
            if end > len(buf):
                raise InvalidFrameError(
                    f"DATA frame_length {length} runs past the datagram ({len(buf) - offset} bytes)"
                )
            payload = bytes(buf[offset + DATA_HEADER_LENGTH : end])
        return cls(
            term_offset=term_offset,
            session_id=session_id,
            stream_id=stream_id,
            term_id=term_id,
            payload=payload,
            flags=flags,
            reserved_value=reserved,
            frame_type=ftype,
            frame_length=length,
            version=version,
        )


@dataclass(frozen=True, slots=True)
class SetupFrame:
    """SETUP (type 0x05), 40 bytes.

    ::

        8  term_offset i32     12 session_id i32     16 stream_id i32
        20 initial_term_id i32 24 active_term_id i32 28 term_length i32
        32 mtu i32             36 ttl i32
    """

    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int = 0
    flags: int = 0
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.SETUP

    def encode(self) -> bytes:
        return SETUP.pack(
            SETUP_LENGTH,
            self.version,
            self.flags,
            FrameType.SETUP,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            self.active_term_id,
            self.term_length,
            self.mtu,
            self.ttl,
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> SetupFrame:
        _need(buf, offset, SETUP_LENGTH, "SETUP")
        (
            length,
            version,
            flags,
            _t,
            term_offset,
            session_id,
            stream_id,
            initial,
            active,
            tlen,
            mtu,
            ttl,
        ) = SETUP.unpack_from(buf, offset)
        _check_version(version)
        _check_length(length, SETUP_LENGTH, "SETUP")
        return cls(
            term_offset, session_id, stream_id, initial, active, tlen, mtu, ttl, flags, version
        )


@dataclass(frozen=True, slots=True)
class StatusMessage:
    """Status message SM (type 0x03), 36 bytes, or 44 with a group tag.

    ::

        8  session_id i32            12 stream_id i32
        16 consumption_term_id i32   20 consumption_term_offset i32
        24 receiver_window i32       28 receiver_id i64
        36 group_tag i64 (optional)
    """

    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    group_tag: int | None = None
    flags: int = 0
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.SM

    def encode(self) -> bytes:
        length = SM_LENGTH if self.group_tag is None else SM_WITH_GROUP_TAG_LENGTH
        out = SM.pack(
            length,
            self.version,
            self.flags,
            FrameType.SM,
            self.session_id,
            self.stream_id,
            self.consumption_term_id,
            self.consumption_term_offset,
            self.receiver_window,
            self.receiver_id,
        )
        if self.group_tag is not None:
            out += SM_GROUP_TAG.pack(self.group_tag)
        return out

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> StatusMessage:
        _need(buf, offset, SM_LENGTH, "SM")
        (
            length,
            version,
            flags,
            _t,
            session_id,
            stream_id,
            term_id,
            term_offset,
            window,
            receiver_id,
        ) = SM.unpack_from(buf, offset)
        _check_version(version)
        group_tag = None
        if length == SM_WITH_GROUP_TAG_LENGTH:
            _need(buf, offset, SM_WITH_GROUP_TAG_LENGTH, "SM with group tag")
            (group_tag,) = SM_GROUP_TAG.unpack_from(buf, offset + SM_LENGTH)
        elif length != SM_LENGTH:
            raise InvalidFrameError(f"SM frame_length {length} is neither 36 nor 44")
        return cls(
            session_id,
            stream_id,
            term_id,
            term_offset,
            window,
            receiver_id,
            group_tag,
            flags,
            version,
        )


@dataclass(frozen=True, slots=True)
class NakFrame:
    """NAK (type 0x02), 28 bytes.

    ::

        8 session_id i32  12 stream_id i32  16 term_id i32  20 term_offset i32  24 length i32
    """

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    flags: int = 0
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.NAK

    def encode(self) -> bytes:
        return NAK.pack(
            NAK_LENGTH,
            self.version,
            self.flags,
            FrameType.NAK,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.term_offset,
            self.length,
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> NakFrame:
        _need(buf, offset, NAK_LENGTH, "NAK")
        (flen, version, flags, _t, session_id, stream_id, term_id, term_offset, length) = (
            NAK.unpack_from(buf, offset)
        )
        _check_version(version)
        _check_length(flen, NAK_LENGTH, "NAK")
        return cls(session_id, stream_id, term_id, term_offset, length, flags, version)


@dataclass(frozen=True, slots=True)
class RttMeasurement:
    """RTT measurement RTTM (type 0x06), 40 bytes. Flag 0x80 on a request asks for a reply.

    ::

        8  session_id i32      12 stream_id i32
        16 echo_timestamp i64  24 reception_delta i64  32 receiver_id i64
    """

    session_id: int
    stream_id: int
    echo_timestamp: int
    reception_delta: int
    receiver_id: int
    flags: int = 0
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.RTTM

    @property
    def is_reply_requested(self) -> bool:
        return bool(self.flags & RTTM_REPLY_FLAG)

    def encode(self) -> bytes:
        return RTTM.pack(
            RTTM_LENGTH,
            self.version,
            self.flags,
            FrameType.RTTM,
            self.session_id,
            self.stream_id,
            self.echo_timestamp,
            self.reception_delta,
            self.receiver_id,
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> RttMeasurement:
        _need(buf, offset, RTTM_LENGTH, "RTTM")
        (flen, version, flags, _t, session_id, stream_id, echo, delta, receiver_id) = (
            RTTM.unpack_from(buf, offset)
        )
        _check_version(version)
        _check_length(flen, RTTM_LENGTH, "RTTM")
        return cls(session_id, stream_id, echo, delta, receiver_id, flags, version)


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """ERR (type 0x04): 40-byte header then up to 1023 bytes of UTF-8 text.

    ::

        8  session_id i32   12 stream_id i32   16 receiver_id i64   24 group_tag i64
        32 error_code i32   36 error_length i32   40 text
    """

    session_id: int
    stream_id: int
    receiver_id: int
    error_code: int
    message: str
    group_tag: int = 0
    flags: int = 0
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.ERR

    def encode(self) -> bytes:
        text = self.message.encode("utf-8")[:ERR_MAX_TEXT_LENGTH]
        return (
            ERR.pack(
                ERR_HEADER_LENGTH + len(text),
                self.version,
                self.flags,
                FrameType.ERR,
                self.session_id,
                self.stream_id,
                self.receiver_id,
                self.group_tag,
                self.error_code,
                len(text),
            )
            + text
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> ErrorFrame:
        _need(buf, offset, ERR_HEADER_LENGTH, "ERR")
        (
            flen,
            version,
            flags,
            _t,
            session_id,
            stream_id,
            receiver_id,
            group_tag,
            code,
            text_len,
        ) = ERR.unpack_from(buf, offset)
        _check_version(version)
        if not 0 <= text_len <= ERR_MAX_TEXT_LENGTH or flen != ERR_HEADER_LENGTH + text_len:
            raise InvalidFrameError(f"ERR frame_length {flen} / error_length {text_len} mismatch")
        _need(buf, offset, flen, "ERR text")
        raw = bytes(buf[offset + ERR_HEADER_LENGTH : offset + flen])
        return cls(
            session_id,
            stream_id,
            receiver_id,
            code,
            raw.decode("utf-8", "replace"),
            group_tag,
            flags,
            version,
        )


@dataclass(frozen=True, slots=True)
class ResponseSetupFrame:
    """RSP_SETUP (type 0x0B), 20 bytes: 8 session_id, 12 stream_id, 16 response_session_id."""

    session_id: int
    stream_id: int
    response_session_id: int
    flags: int = 0
    version: int = CURRENT_VERSION

    TYPE: ClassVar[int] = FrameType.RSP_SETUP

    def encode(self) -> bytes:
        return RSP_SETUP.pack(
            RSP_SETUP_LENGTH,
            self.version,
            self.flags,
            FrameType.RSP_SETUP,
            self.session_id,
            self.stream_id,
            self.response_session_id,
        )

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> ResponseSetupFrame:
        _need(buf, offset, RSP_SETUP_LENGTH, "RSP_SETUP")
        flen, version, flags, _t, session_id, stream_id, rsp = RSP_SETUP.unpack_from(buf, offset)
        _check_version(version)
        _check_length(flen, RSP_SETUP_LENGTH, "RSP_SETUP")
        return cls(session_id, stream_id, rsp, flags, version)


Frame = (
    DataFrame
    | SetupFrame
    | StatusMessage
    | NakFrame
    | RttMeasurement
    | ErrorFrame
    | ResponseSetupFrame
)

_CONTROL_DECODERS: dict[int, Any] = {
    FrameType.SETUP: SetupFrame,
    FrameType.SM: StatusMessage,
    FrameType.NAK: NakFrame,
    FrameType.RTTM: RttMeasurement,
    FrameType.ERR: ErrorFrame,
    FrameType.RSP_SETUP: ResponseSetupFrame,
}


def frame_type_of(buf: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """Type of the frame at ``offset``; raises :class:`InvalidFrameError` if the header is short."""
    _need(buf, offset, HEADER_LENGTH, "frame header")
    _length, version, _flags, ftype = HEADER.unpack_from(buf, offset)
    _check_version(version)
    return int(ftype)


def decode_datagram(buf: bytes | bytearray | memoryview) -> list[Frame]:
    """Decode every frame of one UDP datagram.

    A datagram holds either one control frame, or DATA/PAD frames back to back on 32-byte
    boundaries (a PAD header may end it). A DATA frame with frame_length 0 (a heartbeat) is the
    only frame of its datagram.
    """
    ftype = frame_type_of(buf)
    if ftype in _CONTROL_DECODERS:
        return [_CONTROL_DECODERS[ftype].decode(buf, 0)]
    if ftype not in (FrameType.DATA, FrameType.PAD):
        raise InvalidFrameError(f"unknown frame type {ftype:#x}")
    frames: list[Frame] = []
    offset = 0
    size = len(buf)
    while offset < size:
        frame = DataFrame.decode(buf, offset)
        frames.append(frame)
        if frame.frame_type == FrameType.PAD or frame.length == 0:
            break
        offset += align(frame.length)
    return frames


def _need(buf: bytes | bytearray | memoryview, offset: int, length: int, what: str) -> None:
    if offset < 0 or len(buf) - offset < length:
        raise InvalidFrameError(f"{what} needs {length} bytes, got {max(0, len(buf) - offset)}")


def _check_version(version: int) -> None:
    if version != CURRENT_VERSION:
        raise InvalidFrameError(f"unsupported protocol version {version}")


def _check_length(length: int, expected: int, what: str) -> None:
    if length != expected:
        raise InvalidFrameError(f"{what} frame_length {length}, expected {expected}")

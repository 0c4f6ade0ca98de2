"""Rows from recorded Aeron frames, and payloads from rows.

A replay block is whole raw DATA frames as recorded (see ``client.ReplayBlock``). Each frame's
header carries its term id and term offset, so positions come from the frames themselves; a
fragmented message (BEGIN ... END) becomes one row whose position is its first fragment's.

The ``timestamp`` column is the time the server recorded the message: the time its recording's
index holds at or below the message's position (a replay block never spans two index entries, so
this is the block's ``timestamp_ns``, the same however a replay cut its blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.runs import PayloadRun
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DataFlags,
    FrameType,
    uniform_block,
)
from aeron_spark.transport.protocol.logbuffer import wrap_int32

BINARY_SCHEMA_DDL = (
    "value binary, stream_id int, session_id int, recording_id long, position long, "
    "timestamp timestamp, reserved_value long"
)
TEXT_SCHEMA_DDL = BINARY_SCHEMA_DDL.replace("value binary", "value string", 1)

_FLAG_BEGIN = int(DataFlags.BEGIN)
_FLAG_END = int(DataFlags.END)
_TYPE_PAD = int(FrameType.PAD)


@dataclass(frozen=True, slots=True)
class Message:
    payload: bytes | bytearray | memoryview  # a reassembled message is its own bytearray
    position: int
    session_id: int
    stream_id: int
    reserved_value: int
    timestamp_ns: int


@dataclass(frozen=True, slots=True)
class Geometry:
    initial_term_id: int
    term_length: int

    @property
    def shift(self) -> int:
        return self.term_length.bit_length() - 1


def iter_messages(blocks: Iterable[ReplayBlock], geometry: Geometry) -> Iterator[Message]:
    """Messages of consecutive replay blocks, fragments reassembled (also across blocks),
    positions from the frame headers.

    A range must start and end on message boundaries: a middle or END fragment without its BEGIN,
    or a BEGIN never closed, raises :class:`ControlProtocolError` instead of dropping data.
    """
    partial: bytearray | None = None
    partial_position = 0
    initial_term_id, shift = geometry.initial_term_id, geometry.shift
    unpack = DATA_HEADER.unpack_from
    for block in blocks:
        data = memoryview(block.data)
        ts = block.timestamp_ns
        partial, partial_position = yield from block_messages(
            data, ts, partial, partial_position, initial_term_id, shift, unpack
        )
    if partial is not None:
        raise ControlProtocolError("the replayed range ends inside a fragmented message")


def block_messages(data, ts, partial, partial_position, initial_term_id, shift, unpack):  # type: ignore[no-untyped-def]
    size = len(data)
    offset = 0
    while offset < size:
        if size - offset < 32:
            raise ControlProtocolError(f"replay block ends inside a frame header at byte {offset}")
        length, _v, flags, ftype, term_offset, session_id, stream_id, term_id, rv = unpack(
            data, offset
        )
        if length < 32 or offset + length > size:
            raise ControlProtocolError(
                f"replay block holds a bad frame length {length} at byte {offset}"
            )
        if ftype != _TYPE_PAD:
            position = (wrap_int32(term_id - initial_term_id) << shift) + term_offset
            payload = data[offset + 32 : offset + length]
            if flags & (_FLAG_BEGIN | _FLAG_END) == (_FLAG_BEGIN | _FLAG_END):
                yield Message(payload, position, session_id, stream_id, rv, ts)
            elif flags & _FLAG_BEGIN:
                partial = bytearray(payload)
                partial_position = position
            elif partial is None:
                raise ControlProtocolError(
                    f"the replayed range starts inside a fragmented message (position {position})"
                )
            else:
                partial += payload
                if flags & _FLAG_END:
                    yield Message(partial, partial_position, session_id, stream_id, rv, ts)
                    partial = None
        offset += (length + 31) & -32
    return partial, partial_position


def arrow_schema(text: bool) -> pa.Schema:
    """Exactly what Spark's ``to_arrow_schema`` gives for the source's DDL schema."""
    return pa.schema(
        [
            pa.field("value", pa.string() if text else pa.binary()),
            pa.field("stream_id", pa.int32()),
            pa.field("session_id", pa.int32()),
            pa.field("recording_id", pa.int64()),
            pa.field("position", pa.int64()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("reserved_value", pa.int64()),
        ]
    )


class BatchBuilder:
    """Accumulates messages of one recording and emits Arrow record batches."""

    def __init__(self, recording_id: int, text: bool, rows_per_batch: int = 65536) -> None:
        self.recording_id = recording_id
        self.text = text
        self.schema = arrow_schema(text)
        self.rows_per_batch = rows_per_batch
        self._reset()

    def _reset(self) -> None:
        self.offsets = [0]
        self.values: list[bytes | bytearray | memoryview] = []
        self.total = 0
        self.stream_ids: list[int] = []
        self.session_ids: list[int] = []
        self.positions: list[int] = []
        self.timestamps: list[int] = []
        self.reserved: list[int] = []

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, message: Message) -> None:
        self.values.append(message.payload)
        self.total += len(message.payload)
        self.offsets.append(self.total)
        self.stream_ids.append(message.stream_id)
        self.session_ids.append(message.session_id)
        self.positions.append(message.position)
        self.timestamps.append(message.timestamp_ns // 1000)
        self.reserved.append(message.reserved_value)

    def flush(self) -> pa.RecordBatch | None:
        n = len(self.positions)
        if n == 0:
            return None
        if self.total >= 2**31:
            raise ControlProtocolError("a batch of messages exceeds 2 GiB; lower rows_per_batch")
        values = pa.py_buffer(b"".join(self.values))
        offsets = pa.py_buffer(np.array(self.offsets, dtype=np.int32))
        value_type = pa.string() if self.text else pa.binary()
        value_array = pa.Array.from_buffers(value_type, n, [None, offsets, values])
        if self.text:
            value_array.validate(full=True)  # invalid UTF-8 fails here, naming the batch
        batch = pa.RecordBatch.from_arrays(
            [
                value_array,
                column(self.stream_ids, pa.int32()),
                column(self.session_ids, pa.int32()),
                column(np.full(n, self.recording_id, dtype=np.int64), pa.int64()),
                column(self.positions, pa.int64()),
                column(self.timestamps, TIMESTAMP_US),
                column(self.reserved, pa.int64()),
            ],
            schema=self.schema,
        )
        self._reset()
        return batch


TIMESTAMP_US = pa.timestamp("us", tz="UTC")
_NUMPY_OF = {pa.int32(): np.int32, pa.int64(): np.int64, TIMESTAMP_US: np.int64}


def column(values: Any, arrow_type: pa.DataType) -> pa.Array:
    """Integers (a list or a numpy array, strided too) as an Arrow array of ``arrow_type``
    (int32, int64, timestamp[us, UTC]) without ``pa.array``, whose first call imports pandas:
    ~300 modules and ~40,000 objects more in every Python worker, so in every task's
    ``gc.collect()`` (issue 31 item 2)."""
    data = np.ascontiguousarray(values, dtype=_NUMPY_OF[arrow_type])
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])


@dataclass(frozen=True, slots=True)
class _UniformBlock:
    """A replay block of equal-length unfragmented DATA frames, as views of its bytes."""

    header: np.ndarray  # frames.DATA_HEADER_DTYPE, one per frame
    values: np.ndarray  # (frames, payload length) uint8, strided over the block
    timestamp_us: int

    @property
    def payload_length(self) -> int:
        return int(self.values.shape[1])

    def __len__(self) -> int:
        return len(self.header)


def _uniform_block(block: ReplayBlock) -> _UniformBlock | None:
    """The block as a :class:`_UniformBlock` when it holds equal-length unfragmented DATA frames
    only (fixed-size records), else None (the general path then handles it)."""
    uniform = uniform_block(block.data)
    if uniform is None:
        return None
    header, payloads = uniform
    return _UniformBlock(header, payloads, block.timestamp_ns // 1000)


def _uniform_batch(
    parts: list[_UniformBlock],
    recording_id: int,
    geometry: Geometry,
    text: bool,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """One record batch of consecutive uniform blocks of one payload length: every column is
    computed with numpy, no Python object per message, the payloads copied once."""
    header = parts[0].header if len(parts) == 1 else np.concatenate([p.header for p in parts])
    n = len(header)
    payload_length = parts[0].payload_length
    if len(parts) == 1:
        values = np.ascontiguousarray(parts[0].values).reshape(-1)
    else:
        values = np.concatenate([p.values for p in parts]).reshape(-1)
    if n * payload_length >= 2**31:
        raise ControlProtocolError("a batch of messages exceeds 2 GiB; lower rows_per_batch")
    offsets = np.arange(0, (n + 1) * payload_length, payload_length, dtype=np.int32)
    term_delta = header["term_id"].astype(np.int64) - geometry.initial_term_id
    term_delta = ((term_delta + 2**31) % 2**32) - 2**31
    positions = (term_delta << geometry.shift) + header["term_offset"]
    timestamps = np.repeat(
        np.array([p.timestamp_us for p in parts], dtype=np.int64), [len(p) for p in parts]
    )
    value_type = pa.string() if text else pa.binary()
    value_array = pa.Array.from_buffers(
        value_type, n, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )
    if text:
        value_array.validate(full=True)
    return pa.RecordBatch.from_arrays(
        [
            value_array,
            column(header["stream_id"], pa.int32()),
            column(header["session_id"], pa.int32()),
            column(np.full(n, recording_id, dtype=np.int64), pa.int64()),
            column(positions, pa.int64()),
            column(timestamps, TIMESTAMP_US),
            column(header["reserved_value"], pa.int64()),
        ],
        schema=schema,
    )


def _uniform_block_batch(
    block: ReplayBlock, recording_id: int, geometry: Geometry, text: bool, schema: pa.Schema
) -> pa.RecordBatch | None:
    """The record batch of one block of equal-length unfragmented DATA frames (see
    :func:`_uniform_batch`), or None when the block is not of that shape."""
    uniform = _uniform_block(block)
    if uniform is None:
        return None
    return _uniform_batch([uniform], recording_id, geometry, text, schema)


def batches_from_blocks(
    blocks: Iterable[ReplayBlock],
    recording_id: int,
    geometry: Geometry,
    text: bool,
    rows_per_batch: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages of consecutive replay blocks, in order.

    Blocks of fixed-size unfragmented messages take a vectorised path: consecutive such blocks
    of one message size are gathered into batches of about ``rows_per_batch`` rows (a replay
    block holds a few thousand; larger batches cost Spark less per row). Anything else
    (fragments, mixed sizes) goes message by message. A fragmented message may span blocks.
    """
    builder = BatchBuilder(recording_id, text, rows_per_batch)
    gathered: list[_UniformBlock] = []
    gathered_rows = 0
    partial: bytearray | None = None
    partial_position = 0
    unpack = DATA_HEADER.unpack_from
    for block in blocks:
        if partial is None:
            uniform = _uniform_block(block)
            if uniform is not None:
                pending = builder.flush()
                if pending is not None:
                    yield pending
                if gathered and (
                    uniform.payload_length != gathered[0].payload_length
                    or gathered_rows + len(uniform) > rows_per_batch
                ):
                    yield _uniform_batch(gathered, recording_id, geometry, text, builder.schema)
                    gathered, gathered_rows = [], 0
                gathered.append(uniform)
                gathered_rows += len(uniform)
                continue
        if gathered:
            yield _uniform_batch(gathered, recording_id, geometry, text, builder.schema)
            gathered, gathered_rows = [], 0
        messages = block_messages(
            memoryview(block.data),
            block.timestamp_ns,
            partial,
            partial_position,
            geometry.initial_term_id,
            geometry.shift,
            unpack,
        )
        while True:
            try:
                message = next(messages)
            except StopIteration as stop:
                partial, partial_position = stop.value
                break
            builder.add(message)
            if len(builder) >= rows_per_batch:
                batch = builder.flush()
                if batch is not None:
                    yield batch
    if gathered:
        yield _uniform_batch(gathered, recording_id, geometry, text, builder.schema)
    if partial is not None:
        raise ControlProtocolError("the replayed range ends inside a fragmented message")
    batch = builder.flush()
    if batch is not None:
        yield batch


def payload_run_from_batch(batch: pa.RecordBatch) -> PayloadRun:
    """The payloads (and reserved values, when a ``reserved_value`` column is given) of a
    ``binary`` or ``text`` sink batch as one :class:`PayloadRun`: the same payloads as
    :func:`payloads_from_batch` without a Python object per row."""
    names = batch.schema.names
    if "value" not in names:
        raise ControlProtocolError("the sink needs a `value` column")
    reserved = batch.column(names.index("reserved_value")) if "reserved_value" in names else None
    return PayloadRun.from_columns(batch.column(names.index("value")), reserved)


def payloads_from_batch(batch: pa.RecordBatch, fmt: str) -> tuple[list[bytes], list[int] | None]:
    """Payloads (and reserved values, when a ``reserved_value`` column is given) of a sink batch."""
    names = batch.schema.names
    if "value" not in names:
        raise ControlProtocolError("the sink needs a `value` column")
    column = batch.column(names.index("value"))
    if fmt == "text":
        payloads = [b"" if v is None else v.encode("utf-8") for v in column.to_pylist()]
    else:
        payloads = [b"" if v is None else bytes(v) for v in column.to_pylist()]
    reserved = None
    if "reserved_value" in names:
        reserved = [
            0 if v is None else int(v)
            for v in batch.column(names.index("reserved_value")).to_pylist()
        ]
    return payloads, reserved

"""Record formats: ``json``, ``msgpack`` and ``text`` messages decoded into rows, and back.

Source: each message is one record. ``json`` (one JSON object per message) is parsed by Arrow's
JSON reader many messages at a time straight into the query's schema; ``msgpack`` (one map per
message) is unpacked per message and built into Arrow columns; ``text`` is the message as a UTF-8
string. A message that does not decode is a *bad record*, handled by ``badRecordsPolicy``:

- ``fail`` (default): the read fails with an error naming the recording and position;
- ``drop``: the message is skipped (and counted in the executor's log);
- ``column``: the row is kept with null data columns and the message bytes in the corrupt-record
  column (``corruptRecordColumn``, default ``_corrupt_record``, binary).

Finding bad records costs nothing when there are none: a chunk of messages is decoded at once and
only a chunk that fails is split in halves until the bad messages are isolated.

Sink: ``json`` writes each row as one JSON object (timestamps and dates as ISO 8601 text, decimals
as text); ``msgpack`` writes each row as one map (timestamps as msgpack timestamps).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import msgpack
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.formats import Geometry, Message, arrow_schema, iter_messages
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.errors import ConfigurationError

log = logging.getLogger(__name__)

RECORD_FORMATS = ("json", "msgpack")
BAD_RECORD_POLICIES = ("fail", "drop", "column")
METADATA_FIELDS = tuple(arrow_schema(False))[1:]  # binary's columns after `value`
METADATA_DDL = (
    "stream_id int, session_id int, recording_id long, position long, timestamp timestamp, "
    "reserved_value long"
)
CHUNK_MESSAGES = 4096
CHUNK_BYTES = 4 << 20


class BadRecordError(ControlProtocolError):
    """A message that does not decode in the query's format (badRecordsPolicy=fail)."""


@dataclass(frozen=True)
class Decoding:
    """How a partition turns messages into rows (travels with each input partition)."""

    format: str  # json | msgpack | text
    data_schema: bytes  # serialized Arrow schema of the decoded (data) columns
    policy: str = "fail"
    corrupt_column: str = "_corrupt_record"
    include_metadata: bool = False

    def output_schema(self) -> pa.Schema:
        schema = pa.ipc.read_schema(pa.py_buffer(self.data_schema))
        return full_schema(schema, self.policy, self.corrupt_column, self.include_metadata)


def full_schema(data: pa.Schema, policy: str, corrupt_column: str, metadata: bool) -> pa.Schema:
    """Data columns, then the metadata columns (includeMetadata), then the corrupt-record column
    (badRecordsPolicy=column)."""
    fields = list(data)
    if metadata:
        fields.extend(METADATA_FIELDS)
    if policy == "column":
        fields.append(pa.field(corrupt_column, pa.binary()))
    return pa.schema(fields)


def output_ddl(data_ddl: str, policy: str, corrupt_column: str, include_metadata: bool) -> str:
    """The Spark DDL of the rows a record format produces (data columns, corrupt, metadata)."""
    ddl = data_ddl
    if include_metadata:
        ddl += ", " + METADATA_DDL
    if policy == "column":
        ddl += f", `{corrupt_column}` binary"
    return ddl


def data_columns(schema: pa.Schema, policy: str, corrupt_column: str, metadata: bool) -> pa.Schema:
    """The data part of a query's full schema (strip the corrupt and metadata columns)."""
    drop = {corrupt_column} if policy == "column" else set()
    if metadata:
        drop |= {f.name for f in METADATA_FIELDS}
    return pa.schema([f for f in schema if f.name not in drop])


# --- decoding ------------------------------------------------------------------------------------


def _parse_type(t: pa.DataType) -> pa.DataType:
    """What Arrow's JSON reader parses a field as before the cast to its real type."""
    if pa.types.is_date(t) or pa.types.is_decimal(t) or pa.types.is_time(t):
        return pa.string()
    return t


class _JsonDecoder:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.parse_schema = pa.schema([f.with_type(_parse_type(f.type)) for f in schema])

    def __call__(self, payloads: Sequence[bytes | memoryview]) -> pa.RecordBatch:
        if any(not bytes(p).strip() for p in payloads):
            raise ValueError("an empty message")  # it would shift every later row
        data = b"\n".join(bytes(p) for p in payloads)
        table = pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(block_size=max(len(data) + 1, 1 << 16)),
            parse_options=pa_json.ParseOptions(
                explicit_schema=self.parse_schema,
                unexpected_field_behavior="ignore",
                newlines_in_values=data.count(b"\n") != len(payloads) - 1,
            ),
        )
        if table.num_rows != len(payloads):
            raise ValueError("a message holds more than one JSON value")
        columns = [
            table.column(f.name).cast(f.type) if f.type != p.type else table.column(f.name)
            for f, p in zip(self.schema, self.parse_schema, strict=True)
        ]
        return _one_batch(pa.Table.from_arrays(columns, schema=self.schema))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]


class _MsgpackDecoder:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __call__(self, payloads: Sequence[bytes | memoryview]) -> pa.RecordBatch:
        rows = []
        for p in payloads:
            row = msgpack.unpackb(p, raw=False, timestamp=3, strict_map_key=False)
            if not isinstance(row, dict):
                raise ValueError(f"a msgpack {type(row).__name__}, not a map")
            rows.append(row)
        columns = []
        for f in self.schema:
            values = [r.get(f.name) for r in rows]
            try:
                columns.append(pa.array(values, f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
                columns.append(pa.array(values).cast(f.type))  # e.g. ISO dates as text
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


class _TextDecoder:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __call__(self, payloads: Sequence[bytes | memoryview]) -> pa.RecordBatch:
        offsets = [0]
        for p in payloads:
            offsets.append(offsets[-1] + len(p))
        values = pa.Array.from_buffers(
            pa.string(),
            len(payloads),
            [
                None,
                pa.array(offsets, pa.int32()).buffers()[1],
                pa.py_buffer(b"".join(bytes(p) for p in payloads)),
            ],
        )
        values.validate(full=True)
        return pa.RecordBatch.from_arrays([values], schema=self.schema)


_DECODERS = {"json": _JsonDecoder, "msgpack": _MsgpackDecoder, "text": _TextDecoder}
_DECODE_ERRORS = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    ValueError,
    TypeError,
    msgpack.ExtraData,
    msgpack.FormatError,
    msgpack.StackError,
    OverflowError,
    KeyError,
)


def _decode(decoder, payloads: list) -> tuple[pa.RecordBatch | None, list[int]]:  # type: ignore[no-untyped-def]
    """Decode ``payloads``; returns the good rows and the indices of the bad messages.

    The good rows are in message order with the bad ones left out. A failing chunk is split in
    halves, so k bad messages among n cost O(k log n) extra decodes.
    """
    try:
        return decoder(payloads), []
    except _DECODE_ERRORS:
        if len(payloads) == 1:
            return None, [0]
    middle = len(payloads) // 2
    left, left_bad = _decode(decoder, payloads[:middle])
    right, right_bad = _decode(decoder, payloads[middle:])
    good = [b for b in (left, right) if b is not None and b.num_rows]
    batch = (
        pa.Table.from_batches(good).combine_chunks().to_batches()[0]
        if len(good) > 1
        else (good[0] if good else None)
    )
    return batch, left_bad + [middle + i for i in right_bad]


class RecordDecoder:
    """Turns replayed messages of one recording into record batches of the output schema."""

    def __init__(self, decoding: Decoding, recording_id: int) -> None:
        self.decoding = decoding
        self.recording_id = recording_id
        self.schema = decoding.output_schema()
        self.data_schema = pa.ipc.read_schema(pa.py_buffer(decoding.data_schema))
        self.decoder = _DECODERS[decoding.format](self.data_schema)
        self.dropped = 0

    def batches(
        self, blocks: Iterable[ReplayBlock], geometry: Geometry
    ) -> Iterator[pa.RecordBatch]:
        chunk: list[Message] = []
        size = 0
        for message in iter_messages(blocks, geometry):
            chunk.append(message)
            size += len(message.payload)
            if len(chunk) >= CHUNK_MESSAGES or size >= CHUNK_BYTES:
                yield from self._chunk(chunk)
                chunk, size = [], 0
        if chunk:
            yield from self._chunk(chunk)
        if self.dropped:
            log.warning(
                "recording %d: dropped %d bad %s records (badRecordsPolicy=drop)",
                self.recording_id,
                self.dropped,
                self.decoding.format,
            )

    def _chunk(self, messages: list[Message]) -> Iterator[pa.RecordBatch]:
        good, bad = _decode(self.decoder, [m.payload for m in messages])
        d = self.decoding
        if bad and d.policy == "fail":
            first = messages[bad[0]]
            raise BadRecordError(
                f"the message at position {first.position} of recording {self.recording_id} "
                f"is not a {_NAMES[d.format]} ({len(bad)} bad in this chunk); set "
                "badRecordsPolicy to drop or column to read past bad records"
            )
        keep = messages
        if bad and d.policy == "drop":
            self.dropped += len(bad)
            skip = set(bad)
            keep = [m for i, m in enumerate(messages) if i not in skip]
        if not keep:
            return
        if good is None:
            good = pa.RecordBatch.from_pylist([], schema=self.data_schema)
        columns = list(good.columns)
        if bad and d.policy == "column":
            # good rows in their places, nulls where the bad messages were
            bad_set = set(bad)
            indices: list[int | None] = []
            j = 0
            for i in range(len(messages)):
                if i in bad_set:
                    indices.append(None)
                else:
                    indices.append(j)
                    j += 1
            index_array = pa.array(indices, pa.int64())
            columns = [pc.take(c, index_array) for c in columns]
        if d.include_metadata:
            n = len(keep)
            columns += [
                pa.array([m.stream_id for m in keep], pa.int32()),
                pa.array([m.session_id for m in keep], pa.int32()),
                pa.array([self.recording_id] * n, pa.int64()),
                pa.array([m.position for m in keep], pa.int64()),
                pa.array([m.timestamp_ns // 1000 for m in keep], pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")
                ),
                pa.array([m.reserved_value for m in keep], pa.int64()),
            ]
        if d.policy == "column":
            bad_set = set(bad)
            columns.append(
                pa.array(
                    [bytes(m.payload) if i in bad_set else None for i, m in enumerate(keep)],
                    pa.binary(),
                )
            )
        yield pa.RecordBatch.from_arrays(columns, schema=self.schema)


_NAMES = {"json": "JSON object", "msgpack": "msgpack map", "text": "UTF-8 text"}


def infer_schema(fmt: str, payload: bytes | bytearray | memoryview) -> pa.Schema:
    """The data schema of one record (json/msgpack without a ``schema`` option)."""
    try:
        if fmt == "json":
            return pa_json.read_json(io.BytesIO(bytes(payload))).schema
        row = msgpack.unpackb(payload, raw=False, timestamp=3, strict_map_key=False)
        if not isinstance(row, dict):
            raise ValueError("not a map")
        return pa.RecordBatch.from_pylist([row]).schema
    except _DECODE_ERRORS as exc:
        raise ConfigurationError(
            "schema",
            None,
            f"a schema option (Spark DDL): the first message is not a {_NAMES[fmt]} ({exc})",
        ) from exc


# --- encoding (sink) -----------------------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _msgpack_default(value: object) -> object:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} cannot be packed")


def encode_rows(batch: pa.RecordBatch, fmt: str) -> list[bytes]:
    """One message per row of a sink batch."""
    if fmt == "msgpack" and any(
        pa.types.is_timestamp(f.type) and f.type.tz is None for f in batch.schema
    ):  # msgpack timestamps are instants: read TIMESTAMP_NTZ columns as UTC
        batch = pa.RecordBatch.from_arrays(
            [
                c.cast(pa.timestamp(f.type.unit, tz="UTC"))
                if pa.types.is_timestamp(f.type) and f.type.tz is None
                else c
                for f, c in zip(batch.schema, batch.columns, strict=True)
            ],
            names=batch.schema.names,
        )
    rows = batch.to_pylist()
    if fmt == "json":
        dumps = json.JSONEncoder(
            default=_json_default, separators=(",", ":"), ensure_ascii=False
        ).encode
        return [dumps(r).encode("utf-8") for r in rows]
    packer = msgpack.Packer(default=_msgpack_default, datetime=True)
    return [packer.pack(r) for r in rows]


__all__ = [
    "BAD_RECORD_POLICIES",
    "BadRecordError",
    "Decoding",
    "RECORD_FORMATS",
    "RecordDecoder",
    "data_columns",
    "encode_rows",
    "full_schema",
    "infer_schema",
    "output_ddl",
]

"""``format=sbe``: Simple Binary Encoding messages as typed columns, and rows as SBE messages.

The engine is :mod:`aeron_spark.transport.sbe`; this module binds it to the source and sink.

Source: every message of the stream is one SBE message (header included) of the template named by
``sbeMessage`` (name or template id); its fields, groups and var data are the columns, typed from
the schema (``sbeSchema``: a path or the XML text, read once on the driver and shipped to the
tasks). A replay block of equal-length unfragmented frames (a fixed template) is decoded as one
byte matrix: no Python per message. One template per query: messages of other templates (or of
another schema id) are handled by ``sbeOtherTemplates``: ``fail`` (default; names the position
and template id) or ``skip`` (counted, and logged per partition). To read several templates of
one stream, run one query per template with ``sbeOtherTemplates=skip``. A message that is not
valid SBE (shorter than its header, block, groups or data say) always fails naming its position.

Sink: each row becomes one message of the template, header included. Every value is checked
(range, string length and encoding, enum names, nulls in required fields) for all the rows of a
task before the task stages anything; a value that does not fit fails the task naming the column
and the row (its index in the task's partition).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.formats import Geometry, Message, block_messages
from aeron_spark.connector.formats_records import METADATA_FIELDS, BadRecordError
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import sbe
from aeron_spark.transport.protocol.frames import DATA_HEADER, uniform_block

log = logging.getLogger(__name__)

OTHER_TEMPLATE_POLICIES = ("fail", "skip")
ENUM_MODES = ("names", "raw")
CHUNK_MESSAGES = 8192
ROWS_PER_BATCH = 65536  # uniform blocks are gathered up to this many rows, then decoded


@dataclass
class _Run:
    """A uniform replay block: its payloads as rows of a matrix, and its frames' headers."""

    payloads: np.ndarray
    header: np.ndarray
    positions: np.ndarray
    timestamps_us: np.ndarray


class OtherTemplateRecordError(BadRecordError):
    """A message of another template than ``sbeMessage`` (sbeOtherTemplates=fail)."""


@dataclass(frozen=True)
class SbeOptions:
    """The SBE options of a query (the schema's XML travels with each partition)."""

    schema_xml: str
    message: str  # the message's name
    raw_enums: bool = False
    other_templates: str = "fail"

    def codec(self) -> sbe.MessageCodec:
        return _codec(self.schema_xml, self.message, self.raw_enums)


@functools.lru_cache(maxsize=16)
def _codec(schema_xml: str, message: str, raw_enums: bool) -> sbe.MessageCodec:
    return sbe.load(schema_xml, message, raw_enums)


def parse_sbe_options(o: Mapping[str, str], fmt: str, sink: bool) -> SbeOptions | None:
    """The ``sbe*`` options (lower-cased keys), validated; None unless ``format=sbe``."""
    names = {
        "sbeschema": "sbeSchema",
        "sbemessage": "sbeMessage",
        "sbeenums": "sbeEnums",
        "sbeothertemplates": "sbeOtherTemplates",
    }
    given = [k for k in names if k in o]
    if fmt != "sbe":
        if given:
            raise ConfigurationError(
                names[given[0]], _short(o[given[0]]), f"no SBE option with format={fmt}"
            )
        return None
    source = o.get("sbeschema", "").strip()
    if not source:
        raise ConfigurationError(
            "sbeSchema",
            None,
            "an SBE message schema (a path to its XML file, or the XML text) with format=sbe",
        )
    try:
        schema = sbe.parse_schema(source)
    except sbe.SbeSchemaError as exc:
        raise ConfigurationError("sbeSchema", _short(source), problem=str(exc)) from None
    key = o.get("sbemessage", "").strip()
    if not key:
        if len(schema.messages) != 1:
            listing = ", ".join(f"{m.name} ({m.id})" for m in schema.messages)
            raise ConfigurationError(
                "sbeMessage",
                None,
                f"the message to read or write, by name or template id (the schema has {listing})",
            )
        key = schema.messages[0].name
    try:
        message = schema.message(key)
    except sbe.UnknownMessageError as exc:
        raise ConfigurationError("sbeMessage", key, problem=str(exc)) from None
    enums = o.get("sbeenums", "names").strip().lower()
    if enums not in ENUM_MODES:
        raise ConfigurationError("sbeEnums", enums, " or ".join(ENUM_MODES))
    other = o.get("sbeothertemplates", "fail").strip().lower()
    if other not in OTHER_TEMPLATE_POLICIES:
        raise ConfigurationError("sbeOtherTemplates", other, " or ".join(OTHER_TEMPLATE_POLICIES))
    # one text (includes resolved): the tasks cannot read the driver's files
    xml = sbe.schema_text(source)
    return SbeOptions(xml, message.name, enums == "raw", other)


def _short(text: str) -> str:
    return text if len(text) < 80 else text[:77] + "..."


# --- source ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SbeRead:
    """What each partition carries to decode its messages (options + the query's Arrow schema)."""

    options: SbeOptions
    include_metadata: bool
    output_schema: bytes  # serialized Arrow schema Spark expects


def source_arrow_schema(options: SbeOptions, include_metadata: bool) -> pa.Schema:
    fields = list(options.codec().arrow_schema)
    if include_metadata:
        fields.extend(METADATA_FIELDS)
    return pa.schema(fields)


class SbeBatches:
    """Record batches of one recording range's messages."""

    def __init__(self, read: SbeRead, recording_id: int) -> None:
        self.read = read
        self.codec = read.options.codec()
        self.recording_id = recording_id
        self.schema = pa.ipc.read_schema(pa.py_buffer(read.output_schema))
        self.skipped = 0

    def batches(
        self, blocks: Iterable[ReplayBlock], geometry: Geometry
    ) -> Iterator[pa.RecordBatch]:
        partial: bytearray | None = None
        partial_position = 0
        chunk: list[Message] = []
        runs: list[_Run] = []  # uniform blocks not decoded yet (decoded together)
        for block in blocks:
            if partial is None and self.codec.fixed:
                run = self._uniform(block, geometry)
                if run is not None:
                    if chunk:
                        yield from self._messages(chunk)
                        chunk = []
                    if runs and runs[0].payloads.shape[1] != run.payloads.shape[1]:
                        yield from self._runs(runs)
                        runs = []
                    runs.append(run)
                    if sum(len(r.payloads) for r in runs) >= ROWS_PER_BATCH:
                        yield from self._runs(runs)
                        runs = []
                    continue
            if runs:
                yield from self._runs(runs)
                runs = []
            messages = block_messages(
                memoryview(block.data),
                block.timestamp_ns,
                partial,
                partial_position,
                geometry.initial_term_id,
                geometry.shift,
                DATA_HEADER.unpack_from,
            )
            while True:
                try:
                    chunk.append(next(messages))
                except StopIteration as stop:
                    partial, partial_position = stop.value
                    break
                if len(chunk) >= CHUNK_MESSAGES:
                    yield from self._messages(chunk)
                    chunk = []
        if partial is not None:
            raise ControlProtocolError("the replayed range ends inside a fragmented message")
        if runs:
            yield from self._runs(runs)
        if chunk:
            yield from self._messages(chunk)
        if self.skipped:
            log.warning(
                "recording %d: skipped %d messages of other templates than %s "
                "(sbeOtherTemplates=skip)",
                self.recording_id,
                self.skipped,
                self.codec.message.name,
            )

    def _uniform(self, block: ReplayBlock, geometry: Geometry) -> _Run | None:
        """A block of equal-length unfragmented DATA frames, as a payload matrix (no copy)."""
        data = block.data
        if len(data) < 32:
            return None
        length = int.from_bytes(data[:4], "little", signed=True)
        if length < 32 + self.codec.header_length:
            return None
        uniform = uniform_block(data)
        if uniform is None:
            return None
        header, payloads = uniform
        term = header["term_id"].astype(np.int64) - geometry.initial_term_id
        term = ((term + 2**31) % 2**32) - 2**31
        positions = (term << geometry.shift) + header["term_offset"]
        return _Run(
            payloads,
            header,
            positions,
            np.full(len(header), block.timestamp_ns // 1000, np.int64),
        )

    def _runs(self, runs: list[_Run]) -> Iterator[pa.RecordBatch]:
        """Uniform blocks (of one message length) decoded as one matrix: no Python per message."""
        payloads = (
            np.concatenate([r.payloads for r in runs])
            if len(runs) > 1
            else np.ascontiguousarray(runs[0].payloads)
        )
        header = np.concatenate([r.header for r in runs])
        positions = np.concatenate([r.positions for r in runs])
        try:
            batch, others = self.codec.decode_matrix(payloads)
        except sbe.SbeDecodeError as exc:
            raise self._bad(exc, [int(p) for p in positions]) from None
        keep = None
        if len(others):
            self._others(others, [int(p) for p in positions], lambda i: bytes(payloads[i]))
            keep = np.ones(len(payloads), bool)
            keep[others] = False
        if not batch.num_rows:
            return
        columns = list(batch.columns)
        if self.read.include_metadata:

            def pick(a: np.ndarray) -> np.ndarray:
                return a if keep is None else a[keep]

            columns += [
                pa.array(pick(header["stream_id"]), pa.int32()),
                pa.array(pick(header["session_id"]), pa.int32()),
                pa.array(np.full(batch.num_rows, self.recording_id, np.int64)),
                pa.array(pick(positions), pa.int64()),
                pa.array(pick(np.concatenate([r.timestamps_us for r in runs]))).cast(
                    pa.timestamp("us", tz="UTC")
                ),
                pa.array(pick(header["reserved_value"]), pa.int64()),
            ]
        yield self._out(columns)

    def _messages(self, messages: list[Message]) -> Iterator[pa.RecordBatch]:
        positions = [m.position for m in messages]
        try:
            batch, others = self.codec.decode([m.payload for m in messages])
        except sbe.SbeDecodeError as exc:
            raise self._bad(exc, positions) from None
        keep = messages
        if len(others):
            self._others(others, positions, lambda i: bytes(messages[i].payload))
            drop = set(others.tolist())
            keep = [m for i, m in enumerate(messages) if i not in drop]
        if not keep:
            return
        columns = list(batch.columns)
        if self.read.include_metadata:
            columns += [
                pa.array([m.stream_id for m in keep], pa.int32()),
                pa.array([m.session_id for m in keep], pa.int32()),
                pa.array(np.full(len(keep), self.recording_id, np.int64)),
                pa.array([m.position for m in keep], pa.int64()),
                pa.array([m.timestamp_ns // 1000 for m in keep], pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")
                ),
                pa.array([m.reserved_value for m in keep], pa.int64()),
            ]
        yield self._out(columns)

    def _out(self, columns: list[pa.Array]) -> pa.RecordBatch:
        names = self.schema.names
        batch = pa.RecordBatch.from_arrays(columns, names=names)
        if batch.schema != self.schema:
            batch = batch.cast(self.schema)  # Spark's names for list items ("element")
        return batch

    def _others(self, others: np.ndarray, positions: list[int], payload) -> None:  # type: ignore[no-untyped-def]
        if self.read.options.other_templates == "skip":
            self.skipped += len(others)
            return
        first = int(others[0])
        head = self.codec.headers([payload(first)])[0]
        raise OtherTemplateRecordError(
            f"the message at position {positions[first]} of recording {self.recording_id} is "
            f"template {head[1]} of schema {head[2]}, not {self.codec.message.name} "
            f"({self.codec.message.id}) of schema {self.codec.schema.id} ({len(others)} such "
            "messages in this chunk); set sbeOtherTemplates=skip to read past them",
            position=positions[first],
            template_id=head[1],
            schema_id=head[2],
        )

    def _bad(self, exc: sbe.SbeDecodeError, positions: list[int]) -> BadRecordError:
        index = int(exc.details.get("index", 0))
        position = positions[index] if index < len(positions) else positions[0]
        return BadRecordError(
            f"the message at position {position} of recording {self.recording_id} is not a "
            f"valid SBE {self.codec.message.name} message: {exc.message}",
            position=position,
        )


# --- sink -----------------------------------------------------------------------------------------


def check_sink_schema(arrow: pa.Schema, options: SbeOptions) -> None:
    """Fail on the driver when the DataFrame's columns cannot be this message (unknown columns,
    missing required fields, wrong types): an empty batch goes through the encoder."""
    try:
        options.codec().encode(arrow.empty_table())
    except sbe.SbeEncodeError as exc:
        column = exc.details.get("column")  # that column and its type, not the whole schema
        if column is not None:
            name = f"column {column}"
            value = str(arrow.field(column).type) if column in arrow.names else None
        else:
            name, value = "columns", ", ".join(arrow.names)
        raise ConfigurationError(
            name, value, problem=f"does not fit SBE message {options.message}: {exc.message}"
        ) from None


def encode_task(batches: Iterable[pa.RecordBatch], options: SbeOptions) -> list[bytes]:
    """Every message of a task, all checked before any is returned (so before any is staged).
    Rows are numbered from 0 over the whole task in errors."""
    codec = options.codec()
    out: list[bytes] = []
    for batch in batches:
        try:
            out.extend(codec.encode(batch))
        except sbe.SbeEncodeError as exc:
            row = exc.details.get("row")
            if row is None:
                raise
            row += len(out)
            column = exc.details.get("column")
            raise sbe.SbeEncodeError(
                f"column {column!r}, row {row} of this task: {exc.message.partition(': ')[2]}",
                column=column,
                row=row,
            ) from None
    return out


__all__ = [
    "OtherTemplateRecordError",
    "SbeBatches",
    "SbeOptions",
    "SbeRead",
    "check_sink_schema",
    "encode_task",
    "parse_sbe_options",
    "source_arrow_schema",
]

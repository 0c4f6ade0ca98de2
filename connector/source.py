"""The ``aeron`` source: batch and streaming readers over a stream server's recordings.

Offsets are ``{"<recording_id>": position}`` (JSON object, keys sorted), one entry per recording
of the chosen streams: a recording is a Spark "partition" the way a Kafka partition is. With several
servers (``endpoint=a:1,b:2``) the keys are ``"<endpoint>/<recording_id>"``. Every
input partition is a small picklable value that carries all a task needs (server settings,
recording id, range, geometry, format); ``read()`` runs on an executor, opens its own session and
reads exactly ``[start, end)`` (from the server's segment files when the executor sees them, see
:mod:`~aeron_spark.connector.local`, else replayed over the session), so a re-run task returns
the same rows.

With ``readOn=driver`` the streaming reader is :class:`AeronDriverStreamReader` instead: the
driver replays each micro-batch's ranges while it plans the batch, and Spark hands those rows to
its tasks from the block manager (its prefetching path for Python sources), so a micro-batch costs
no Python worker at all: the lowest latency, for streams light enough to pass through the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from aeron_spark.connector import formats_arrow
from aeron_spark.connector.client import ClientSettings, RecordingInfo, StreamClient, pooled
from aeron_spark.connector.errors import PositionOutOfRangeError, PurgedError
from aeron_spark.connector.formats import (
    BINARY_SCHEMA_DDL,
    TEXT_SCHEMA_DDL,
    Geometry,
    batches_from_blocks,
    iter_messages,
)
from aeron_spark.connector.formats_records import (
    BadRecordError,
    Decoding,
    RecordDecoder,
    data_columns,
    full_schema,
    infer_schema,
    output_ddl,
)
from aeron_spark.connector.formats_sbe import SbeBatches, SbeRead, source_arrow_schema
from aeron_spark.connector.options import SourceOptions
from aeron_spark.connector.pushdown import Pushed, push_filters
from aeron_spark.errors import ConfigurationError

log = logging.getLogger("aeron_spark.connector.source")


@dataclass(frozen=True)
class RecordingRange(InputPartition):
    """One task's work: read ``[start, end)`` of one recording."""

    settings: ClientSettings
    recording_id: int
    start: int
    end: int
    initial_term_id: int
    term_length: int
    text: bool
    arrow_schema: bytes | None = None  # format=arrow: the serialized Arrow schema of the rows
    decoding: Decoding | None = None  # json, msgpack; text read past bad records
    local_reads: bool = True  # read from the server's files when this process sees them
    sbe: SbeRead | None = None  # format=sbe


def read_range(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RecordingRange):
        # Spark plans one placeholder InputPartition when partitions() returned none (a micro-batch
        # with no new data, e.g. one run only to move the watermark): it holds no rows.
        return
    if partition.end <= partition.start:
        return
    geometry = Geometry(partition.initial_term_id, partition.term_length)
    with pooled(partition.settings) as client:  # Python workers are reused: so are sessions
        blocks = client.read_range(
            partition.recording_id, partition.start, partition.end, local=partition.local_reads
        )
        if partition.arrow_schema is not None:
            schema = pa.ipc.read_schema(pa.py_buffer(partition.arrow_schema))
            yield from formats_arrow.batches_from_blocks(blocks, geometry, schema)
        elif partition.sbe is not None:
            yield from SbeBatches(partition.sbe, partition.recording_id).batches(blocks, geometry)
        elif partition.decoding is not None:
            decoder = RecordDecoder(partition.decoding, partition.recording_id)
            yield from decoder.batches(blocks, geometry)
        else:
            try:
                yield from batches_from_blocks(
                    blocks, partition.recording_id, geometry, partition.text
                )
            except pa.ArrowInvalid as exc:  # text: invalid UTF-8 (the vectorised path)
                raise BadRecordError(
                    f"recording {partition.recording_id} holds a message in "
                    f"[{partition.start}, {partition.end}) that is not UTF-8 text ({exc}); set "
                    "badRecordsPolicy to drop or column to read past bad records"
                ) from exc


@dataclass(frozen=True)
class _Rec:
    """A recording of one of the source's servers, under its offset key."""

    key: str
    settings: ClientSettings
    info: RecordingInfo


def offset_key(options: SourceOptions, endpoint: str, recording_id: int) -> str:
    """``"<recording_id>"`` with one server, ``"<endpoint>/<recording_id>"`` with several."""
    if len(options.all_settings) == 1:
        return str(recording_id)
    return f"{endpoint}/{recording_id}"


def _recordings(options: SourceOptions) -> dict[str, _Rec]:
    out: dict[str, _Rec] = {}
    for settings in options.all_settings:
        with pooled(settings) as client:
            for r in client.list_recordings(stream_ids=list(options.stream_ids)):
                key = offset_key(options, settings.endpoint, r.recording_id)
                out[key] = _Rec(key, settings, r)
    return out


def _start_position(options: SourceOptions, rec: _Rec, client: StreamClient | None) -> int:
    info = rec.info
    by_time = options.starting_by_timestamp or {}
    ts_ms = options.starting_timestamp_ms
    if ts_ms is None:
        ts_ms = by_time.get(rec.key)
    if ts_ms is not None and client is not None:
        return max(info.purged_position, client.position_at(info.recording_id, ts_ms * 1_000_000))
    spec = options.starting
    if spec == "latest":
        return info.recorded_position
    if isinstance(spec, dict) and rec.key in spec:
        return spec[rec.key]
    return info.purged_position


def _start_positions(options: SourceOptions, recordings: dict[str, _Rec]) -> dict[str, int]:
    out: dict[str, int] = {}
    for settings in options.all_settings:
        mine = [r for r in recordings.values() if r.settings == settings]
        if not mine:
            continue
        with pooled(settings) as client:
            for rec in mine:
                out[rec.key] = _start_position(options, rec, client)
    return out


def _positions_at(
    options: SourceOptions, recordings: dict[str, _Rec], timestamps_ms: dict[str, int]
) -> dict[str, int]:
    """Each named recording's first position recorded at or after its time (its time index)."""
    out: dict[str, int] = {}
    for settings in options.all_settings:
        mine = [r for r in recordings.values() if r.settings == settings and r.key in timestamps_ms]
        if not mine:
            continue
        with pooled(settings) as client:
            for rec in mine:
                ns = timestamps_ms[rec.key] * 1_000_000
                out[rec.key] = max(
                    rec.info.purged_position, client.position_at(rec.info.recording_id, ns)
                )
    return out


def _narrow(
    pushed: Pushed, recordings: dict[str, _Rec], start: dict[str, int], end: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Start and end positions cut to the pushed filters (message boundaries still)."""
    start, end = dict(start), dict(end)
    for key in sorted(end):
        rec = recordings.get(key)
        if rec is None:
            continue
        begin = max(start.get(key, rec.info.start_position), rec.info.purged_position)
        if end[key] <= begin:
            continue
        with pooled(rec.settings) as client:
            start[key], end[key] = pushed.narrow(client, rec.info.recording_id, begin, end[key])
    return start, end


def _check_loss(options: SourceOptions, rec: _Rec, start: int) -> int:
    """The position to read from: ``start``, or the first readable one when data was purged."""
    purged = rec.info.purged_position
    if start >= purged:
        return start
    if options.fail_on_data_loss:
        raise PurgedError(
            f"recording {rec.key}: positions [{start}, {purged}) were purged; "
            "set failOnDataLoss=false to skip them"
        )
    log.warning("recording %s: skipping purged range [%d, %d)", rec.key, start, purged)
    return purged


def _partitions(
    options: SourceOptions,
    recordings: dict[str, _Rec],
    start: dict[str, int],
    end: dict[str, int],
) -> list[RecordingRange]:
    parts = []
    for key in sorted(end):
        rec = recordings.get(key)
        if rec is None:
            continue
        begin = _check_loss(options, rec, start.get(key, rec.info.start_position))
        if end[key] > begin:
            parts.append(
                RecordingRange(
                    rec.settings,
                    rec.info.recording_id,
                    begin,
                    end[key],
                    rec.info.initial_term_id,
                    rec.info.term_length,
                    options.format == "text",
                    local_reads=options.local_reads,
                )
            )
    return parts


def _split(parts: list[RecordingRange], min_partitions: int | None) -> list[RecordingRange]:
    """Cut ranges at message boundaries until there are about ``min_partitions`` of them, each
    recording's share proportional to its bytes (deterministic: recorded data never changes)."""
    if not min_partitions or len(parts) >= min_partitions or not parts:
        return parts
    total = sum(p.end - p.start for p in parts)
    out: list[RecordingRange] = []
    for part in parts:
        share = max(1, round(min_partitions * (part.end - part.start) / total))
        if share == 1:
            out.append(part)
            continue
        with pooled(part.settings) as client:
            splits = client.scan(part.recording_id, part.start, part.end, parts=share).splits
        bounds = [part.start, *splits, part.end]
        out.extend(
            dataclasses.replace(part, start=a, end=b)
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        )
    return out


def _limited_ends(
    recordings: dict[str, _Rec],
    begin: dict[str, int],
    target: dict[str, int],
    max_messages: int | None,
    max_bytes: int | None,
) -> tuple[dict[str, int], int]:
    """Ends (message boundaries) of the next micro-batch within the limits, and its message count.

    The budget is shared evenly between recordings with data first, then what is left goes to
    those with more, so one recording's backlog never starves the others."""
    ends = dict(begin)
    waiting = sorted(key for key in target if target[key] > begin.get(key, target[key]))
    messages_left = max_messages
    bytes_left = max_bytes
    total = 0
    for rounds in (0, 1):
        if not waiting:
            break
        share_messages = None if messages_left is None else max(1, messages_left // len(waiting))
        share_bytes = None if bytes_left is None else max(1, bytes_left // len(waiting))
        for key in list(waiting):
            if messages_left is not None and messages_left <= 0:
                break
            if bytes_left is not None and bytes_left <= 0:
                break
            rec = recordings[key]
            with pooled(rec.settings) as client:
                got = client.scan(
                    rec.info.recording_id,
                    ends[key],
                    target[key],
                    max_messages=messages_left if rounds else share_messages,
                    max_bytes=bytes_left if rounds else share_bytes,
                )
            total += got.messages
            if messages_left is not None:
                messages_left -= got.messages
            if bytes_left is not None:
                bytes_left -= got.end - ends[key]
            ends[key] = got.end
            if got.end >= target[key] or got.messages == 0:
                waiting.remove(key)
    return ends, total


def encode_offset(positions: dict[str, int]) -> dict[str, int]:
    return {str(k): int(positions[k]) for k in sorted(positions, key=str)}


def decode_offset(offset: dict) -> dict[str, int]:
    return {str(k): int(v) for k, v in offset.items()}


def _with_format(parts: list[RecordingRange], fields: dict) -> list[RecordingRange]:
    if not fields:
        return parts
    return [dataclasses.replace(p, **fields) for p in parts]


def format_fields(options: SourceOptions, schema: StructType | None) -> dict:
    """What each partition carries to decode its messages in the query's format and schema."""
    fmt = options.format
    if fmt in ("binary",) or schema is None:
        return {}
    if fmt == "text" and options.bad_records_policy == "fail":
        return {}  # the vectorised path
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC")
    if fmt == "sbe" and options.sbe is not None:
        return {
            "sbe": SbeRead(options.sbe, options.include_metadata, arrow.serialize().to_pybytes())
        }
    if fmt == "arrow":
        return {"arrow_schema": arrow.serialize().to_pybytes()}
    policy, column = options.bad_records_policy, options.corrupt_record_column
    metadata = options.include_metadata or fmt == "text"
    data = data_columns(arrow, policy, column, metadata)
    return {"decoding": Decoding(fmt, data.serialize().to_pybytes(), policy, column, metadata)}


def source_schema(options: SourceOptions) -> str | StructType:
    """The rows' schema for ``DataSource.schema()``: given (``schema``) or inferred."""
    from pyspark.sql.pandas.types import from_arrow_schema

    fmt = options.format
    if fmt in ("binary", "text"):
        ddl = TEXT_SCHEMA_DDL if fmt == "text" else BINARY_SCHEMA_DDL
        if fmt == "text" and options.bad_records_policy == "column":
            ddl += f", `{options.corrupt_record_column}` binary"
        return ddl
    if fmt == "arrow":
        return options.schema_ddl or from_arrow_schema(first_message_schema(options))
    if fmt == "sbe" and options.sbe is not None:
        return from_arrow_schema(source_arrow_schema(options.sbe, options.include_metadata))
    policy, column = options.bad_records_policy, options.corrupt_record_column
    if options.schema_ddl:
        return output_ddl(options.schema_ddl, policy, column, options.include_metadata)
    data = first_message_schema(options)
    return from_arrow_schema(full_schema(data, policy, column, options.include_metadata))


def first_message_schema(options: SourceOptions) -> pa.Schema:
    """The schema of the first message of the streams (no ``schema`` option given)."""
    for settings in options.all_settings:
        with pooled(settings) as client:
            for rec in client.list_recordings(stream_ids=list(options.stream_ids)):
                start = max(rec.start_position, rec.purged_position)
                if rec.recorded_position <= start:
                    continue
                first = client.scan(rec.recording_id, start, max_messages=1)
                blocks = client.replay(rec.recording_id, start, first.end)
                geometry = Geometry(rec.initial_term_id, rec.term_length)
                for message in iter_messages(blocks, geometry):
                    if options.format == "arrow":
                        return formats_arrow.schema_of_payload(message.payload, message.position)
                    return infer_schema(options.format, message.payload)
    raise ConfigurationError(
        "schema", None, "a schema option (Spark DDL), since the streams hold no message yet"
    )


class AeronBatchReader(DataSourceReader):
    """``spark.read.format("aeron")``: a bounded read of every recording of the streams."""

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self._format = format_fields(options, schema)
        self._pushed = Pushed()

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        recordings = _recordings(o)
        if self._pushed.sets:
            recordings = {k: r for k, r in recordings.items() if self._pushed.keeps(r.info)}
        start = _start_positions(o, recordings)
        if o.ending_timestamp_ms is not None:
            end = _positions_at(o, recordings, {k: o.ending_timestamp_ms for k in recordings})
            end = {k: min(p, recordings[k].info.recorded_position) for k, p in end.items()}
        elif isinstance(o.ending, dict):
            unknown = set(o.ending) - set(recordings)
            if unknown:
                raise PositionOutOfRangeError(
                    f"endingPositions names unknown recordings {sorted(unknown)}"
                )
            end = {
                key: min(pos, recordings[key].info.recorded_position)
                for key, pos in o.ending.items()
            }
        else:
            end = {key: rec.info.recorded_position for key, rec in recordings.items()}
        if not self._pushed.empty:
            start, end = _narrow(self._pushed, recordings, start, end)
        parts = _split(_partitions(o, recordings, start, end), o.min_partitions)
        return _with_format(parts, self._format)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


class AeronFilteringBatchReader(AeronBatchReader):
    """:class:`AeronBatchReader` taking Spark's filters (``spark.sql.python.filterPushdown.
    enabled=true``; Spark refuses a reader with ``pushFilters`` while that is off, so the data
    source hands this one only when it is on)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Narrow the read by what the store can answer (see :mod:`.pushdown`); with the
        metadata columns only (``format=binary/text``, or ``includeMetadata``). Every filter is
        returned: Spark still applies it to the rows read."""
        o = self.options
        if o.format in ("binary", "text") or (o.include_metadata and o.format != "arrow"):
            return push_filters(self._pushed, filters)
        return filters


class AeronStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("aeron")``: micro-batches of newly recorded messages.

    Admission control: ``maxMessagesPerTrigger`` / ``maxBytesPerTrigger`` /
    ``minMessagesPerTrigger``
    become Spark's default read limit; every micro-batch ends on message boundaries the server
    finds (``scan``), so no batch tears a fragmented message. ``Trigger.AvailableNow`` reads up to
    the recorded positions at the time the query starts, in limited batches if limits are set.
    """

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self._format = format_fields(options, schema)
        self._latest: dict[str, int] = {}
        self._available_now: dict[str, int] | None = None
        self._last_batch = time.monotonic()

    def initialOffset(self) -> dict:
        return encode_offset(_start_positions(self.options, _recordings(self.options)))

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {
            key: rec.info.recorded_position for key, rec in _recordings(self.options).items()
        }

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_messages_per_trigger is not None:
            return ReadMaxRows(o.max_messages_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_messages_per_trigger is not None:
            return ReadMinRows(o.min_messages_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        o = self.options
        recordings = _recordings(o)
        current = decode_offset(start) if start else {}
        begin = dict(current)
        target: dict[str, int] = {}
        for key, rec in recordings.items():
            # Scan from the first readable position; a purged gap is partitions()' business
            # (failOnDataLoss), so it fails or is skipped there, not here.
            begin[key] = max(begin.get(key, rec.info.start_position), rec.info.purged_position)
            latest = rec.info.recorded_position
            if self._available_now is not None:
                latest = min(latest, self._available_now.get(key, begin[key]))
            target[key] = max(latest, begin[key])
        self._latest = {**current, **{k: r.info.recorded_position for k, r in recordings.items()}}
        max_messages = max_bytes = min_messages = None
        if limit is not None and not isinstance(limit, ReadAllAvailable):
            # Spark hands one limit; the other limits from the options still apply.
            max_messages = o.max_messages_per_trigger
            max_bytes = o.max_bytes_per_trigger
            min_messages = o.min_messages_per_trigger
            if isinstance(limit, ReadMaxRows):
                max_messages = limit.max_rows
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
            elif isinstance(limit, ReadMinRows):
                min_messages = limit.min_rows
        ends, messages = _limited_ends(recordings, begin, target, max_messages, max_bytes)
        if min_messages is not None and messages < min_messages and self._available_now is None:
            waited_ms = (time.monotonic() - self._last_batch) * 1000
            if waited_ms < o.max_trigger_delay_ms:
                return encode_offset(current) if start else encode_offset(begin)
        if messages:
            self._last_batch = time.monotonic()
            log.info(
                "aeron source streams %s: next batch %d messages; %d bytes behind the latest "
                "position after it",
                list(o.stream_ids),
                messages,
                sum(self._latest[k] - ends[k] for k in recordings),
            )
        for key, pos in current.items():
            ends.setdefault(key, pos)  # a recording no longer listed keeps its offset
        return encode_offset(ends)

    def reportLatestOffset(self) -> dict | None:
        return encode_offset(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        recordings = _recordings(self.options)
        begin = decode_offset(start)
        for key, rec in recordings.items():
            # A recording that appeared after the start offset was taken starts at its beginning.
            begin.setdefault(key, rec.info.start_position)
        parts = _partitions(self.options, recordings, begin, decode_offset(end))
        return _with_format(_split(parts, self.options.min_partitions), self._format)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part: Any = partition  # a RecordingRange (or Spark's placeholder)
        started = time.monotonic()
        rows = 0
        for batch in read_range(partition):
            rows += batch.num_rows
            yield batch
        log.debug(
            "recording %d [%d, %d): %d rows in %.3f s",
            part.recording_id,
            part.start,
            part.end,
            rows,
            time.monotonic() - started,
        )

    def commit(self, end: dict) -> None:
        """With a ``consumerId``: tell each server how far this query has processed its
        recordings, so its retention may purge below (and keeps what is above). Best effort: a
        server that cannot be told is logged, not fatal (its retention then keeps more, or, if it
        ignores consumers, ``failOnDataLoss`` reports what was purged unread)."""
        o = self.options
        if o.consumer_id is None:
            return
        offsets = decode_offset(end)
        for settings in o.all_settings:
            positions: dict[int, int] = {}
            for key, pos in offsets.items():
                endpoint, _, rid = key.rpartition("/")
                if (endpoint or settings.endpoint) == settings.endpoint:
                    positions[int(rid)] = pos
            try:
                with pooled(settings) as client:
                    client.consumer_commit(o.consumer_id, o.stream_ids, positions)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                log.warning(
                    "aeron source: could not commit consumer %r positions to %s: %s",
                    o.consumer_id,
                    settings.endpoint,
                    exc,
                )

    def stop(self) -> None:
        """Sessions are per call; nothing stays open between micro-batches."""


class AeronDriverStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """``readOn=driver``: the same offsets, limits and ranges as :class:`AeronStreamReader`, but
    the driver replays each micro-batch when Spark asks for the next offset, and Spark passes the
    rows to its tasks itself (no Python worker per task).

    Spark keeps the prefetched rows until the batch commits; after a restart, batches planned but
    not committed are read again through :meth:`readBetweenOffsets` (on an executor), which
    replays the same ranges, so the rows are the same. Spark's own read limits do not reach such
    a reader, so ``maxMessagesPerTrigger`` and the other limits are applied here.
    """

    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        self._planner = AeronStreamReader(options, schema)

    def initialOffset(self) -> dict:
        return self._planner.initialOffset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._planner.prepareForTriggerAvailableNow()

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        planner = self._planner
        end = planner.latestOffset(start, planner.getDefaultReadLimit())
        if decode_offset(end) == decode_offset(start):
            return iter(()), start
        # A list, not a generator: Spark copies the iterator when it hands the batch on.
        return iter(list(self._rows(start, end))), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        return iter(list(self._rows(start, end)))

    def _rows(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        for partition in self._planner.partitions(start, end):
            yield from read_range(partition)

    def commit(self, end: dict) -> None:
        self._planner.commit(end)

"""The ``aeron`` source in archive mode: the recordings of a real Aeron Archive as partitions.

``spark.read/readStream.format("aeron").option("archive", "aeron:udp?endpoint=host:8010")
.option("streamId", 1001)`` (optionally ``.option("channel", "<fragment>")``) reads every
recording of that stream the archive holds (whose channel contains the fragment), the way the
stream-server source reads its recordings:

* offsets are ``{"<archiveId>/<recordingId>": position}``; ``latestOffset`` comes from the
  recording position of active recordings and the stop position of stopped ones, and recordings
  that appear later are picked up (from their start);
* ``startingPositions`` earliest (each recording's start position), latest, or JSON;
  ``failOnDataLoss`` for ranges purged (below the start position) or truncated away;
* ``maxMessagesPerTrigger`` / ``maxBytesPerTrigger`` cut micro-batches at message boundaries,
  found by replaying from the batch start on the driver and stopping at the budget;
  ``minPartitions`` splits ranges into as many shares as asked, proportionally to their bytes,
  each task taking the messages that *begin* in its share: a share's replay starts at the term
  boundary at or below it (every term starts with a frame), so a task reads at most one term
  more than its share;
* each task opens its own control session and a bounded replay of exactly its range (to its
  own subscription port, so its own replay session), writes the recording's session id back
  over the replay's in every frame, and decodes the frames with the source's payload formats:
  a retried task reads the same bytes and returns the same rows. A replay that stalls or an
  archive that goes away fails the task within ``timeoutMs``.

The ``timestamp`` column holds the recording's start time: an Aeron Archive keeps no time per
message.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from aeron_spark.connector import formats_arrow
from aeron_spark.connector.archive_markers import (
    frames,
    is_sink_target,
    mask_markers,
    read_tail,
)
from aeron_spark.connector.archive_options import (
    ArchiveConnect,
    ArchiveSourceOptions,
    connect,
    parse_archive_source_options,
)
from aeron_spark.connector.errors import PositionOutOfRangeError, PurgedError
from aeron_spark.connector.formats import Geometry, batches_from_blocks, iter_messages
from aeron_spark.connector.formats_records import (
    BadRecordError,
    Decoding,
    RecordDecoder,
    full_schema,
    infer_schema,
)
from aeron_spark.connector.formats_sbe import SbeBatches, SbeRead
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.source import decode_offset, encode_offset, format_fields, source_schema
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client import ArchiveClient, RecordingDescriptor
from aeron_spark.transport.archive.client.client import ReplayedBlock
from aeron_spark.transport.protocol.frames import FRAME_ALIGNMENT

log = logging.getLogger("aeron_spark.connector.archive_source")

_FLAG_BEGIN, _FLAG_END = 0x80, 0x40
_TYPE_PAD = 0x00


@dataclass(frozen=True, slots=True)
class ArchivedRecording:
    """A recording of the source's streams, under its offset key; ``end`` is its recorded
    position (active) or stop position (stopped); for an archive sink's target, the end of its
    last committed batch (read-committed)."""

    key: str
    descriptor: RecordingDescriptor
    end: int

    @property
    def start(self) -> int:
        return self.descriptor.start_position


def list_archived(o: ArchiveSourceOptions) -> dict[str, ArchivedRecording]:
    out: dict[str, ArchivedRecording] = {}
    with connect(o.connect) as client:
        archive_id = client.archive_id()
        for stream_id in o.source.stream_ids:
            for d in client.list_recordings_for_uri(o.channel, stream_id):
                end = d.stop_position
                if d.is_active:
                    end = client.recording_position(d.recording_id)
                    if end < 0:  # stopped since it was listed
                        end = client.stop_position(d.recording_id)
                if end < 0:
                    continue
                if is_sink_target(d.original_channel) and end > d.start_position:
                    # read-committed: up to the last END marker of the sink's appends
                    end = read_tail(
                        client, d.recording_id, d.start_position, end, d.term_buffer_length
                    ).committed_end
                key = f"{archive_id}/{d.recording_id}"
                out[key] = ArchivedRecording(key, d, end)
    return out


def scan(
    client: ArchiveClient,
    rec: ArchivedRecording,
    start: int,
    target: int,
    max_messages: int | None,
    max_bytes: int | None,
) -> tuple[int, int]:
    """(end, messages): the furthest message boundary in ``(start, target]`` within the
    budget (at least one message when there is one), found by replaying from ``start`` and
    stopping the replay once the budget is spent."""
    if target <= start:
        return start, 0
    if max_messages is None and max_bytes is None:
        return target, -1  # everything: the count is not needed
    end, messages = start, 0
    replay = client.replay(rec.descriptor.recording_id, start, target)
    blocks: Iterable[ReplayedBlock] = replay
    if is_sink_target(rec.descriptor.original_channel):
        blocks = _without_markers(replay)
    try:
        for block in blocks:
            for at, aligned, _length, flags, ftype in frames(block.data):
                if ftype == _TYPE_PAD or not flags & _FLAG_END:
                    continue
                boundary = block.position + at + aligned
                if messages and max_bytes is not None and boundary - start > max_bytes:
                    return end, messages
                end, messages = boundary, messages + 1
                if max_messages is not None and messages >= max_messages:
                    return end, messages
        return target, messages
    finally:
        replay.close()  # stops the replay if it is still running


@dataclass(frozen=True)
class ArchiveRange(InputPartition):
    """One task's work: the messages of a recording that begin in ``[start, end)``, replayed
    from the archive up to ``limit`` (``end`` itself when ``exact``: both ends are message
    boundaries)."""

    connect: ArchiveConnect
    key: str
    recording_id: int
    session_id: int
    stream_id: int
    start: int
    end: int
    limit: int
    exact: bool
    initial_term_id: int
    term_length: int
    timestamp_ns: int
    text: bool
    arrow_schema: bytes | None = None
    decoding: Decoding | None = None
    sbe: SbeRead | None = None
    sink_target: bool = False  # an archive sink's target: its marker frames are not rows
    # where the replay starts when ``start`` is not a frame boundary (a share of a split range):
    # the term boundary at or below ``start``; None: ``start``
    replay_from: int | None = None


def _owned(blocks: Iterable[ReplayedBlock], p: ArchiveRange) -> Iterator[ReplayedBlock]:
    """The frames of the messages that begin in ``[p.start, p.end)``: leading fragments of a
    message begun before ``start`` are dropped, and reading stops after the last message that
    began before ``end`` is complete."""
    started = p.start == 0
    open_message = False
    for block in blocks:
        first = last = None
        done = False
        for at, aligned, _length, flags, ftype in frames(block.data):
            position = block.position + at
            if position < p.start:  # replayed from the term boundary below the share
                continue
            if ftype == _TYPE_PAD:
                if first is not None:
                    last = at + aligned
                continue
            if not started:
                if not flags & _FLAG_BEGIN:
                    continue
                started = True
            if flags & _FLAG_BEGIN:
                if position >= p.end:
                    done = True
                    break
                open_message = not flags & _FLAG_END
            elif flags & _FLAG_END:
                open_message = False
            if first is None:
                first = at
            last = at + aligned
        if first is not None and last is not None:
            yield ReplayedBlock(
                block.position + first, block.data[first:last], block.position + last
            )
        if done or (started and not open_message and block.end_position >= p.end):
            return


def _without_markers(blocks: Iterable[ReplayedBlock]) -> Iterator[ReplayedBlock]:
    """The archive sink's BEGIN/END marker frames turned into padding (not rows)."""
    for b in blocks:
        data, masked = mask_markers(b.data)
        yield b if not masked else ReplayedBlock(b.position, data, b.end_position)


def read_archive_range(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, ArchiveRange) or partition.end <= partition.start:
        return
    p = partition
    with connect(p.connect) as client:
        replayed = client.replay(
            p.recording_id,
            p.start if p.replay_from is None else p.replay_from,
            p.end if p.exact else p.limit,
            session_id=p.session_id,
            stream_id=p.stream_id,
        )
        try:
            owned = replayed if p.exact else _owned(replayed, p)
            if p.sink_target:
                owned = _without_markers(owned)
            blocks = (
                ReplayBlock(b.position, b.data, p.timestamp_ns, b.end_position) for b in owned
            )
            yield from _rows(blocks, p)
        finally:
            replayed.close()


def _rows(blocks: Iterator[ReplayBlock], p: ArchiveRange) -> Iterator[pa.RecordBatch]:
    geometry = Geometry(p.initial_term_id, p.term_length)
    if p.arrow_schema is not None:
        schema = pa.ipc.read_schema(pa.py_buffer(p.arrow_schema))
        yield from formats_arrow.batches_from_blocks(blocks, geometry, schema)
    elif p.sbe is not None:
        yield from SbeBatches(p.sbe, p.recording_id).batches(blocks, geometry)
    elif p.decoding is not None:
        yield from RecordDecoder(p.decoding, p.recording_id).batches(blocks, geometry)
    else:
        try:
            yield from batches_from_blocks(blocks, p.recording_id, geometry, p.text)
        except pa.ArrowInvalid as exc:
            raise BadRecordError(
                f"recording {p.key} holds a message in [{p.start}, {p.end}) that is not UTF-8 "
                f"text ({exc}); set badRecordsPolicy to drop or column to read past bad records"
            ) from exc


# ------------------------------------------------------------------ planning


def _start_positions(o: ArchiveSourceOptions, recs: dict[str, ArchivedRecording]) -> dict[str, int]:
    spec = o.source.starting
    out = {}
    for key, rec in recs.items():
        if spec == "latest":
            out[key] = rec.end
        elif isinstance(spec, dict) and key in spec:
            out[key] = spec[key]
        else:
            out[key] = rec.start
    return out


def _check_loss(o: ArchiveSourceOptions, rec: ArchivedRecording, start: int) -> int | None:
    """Where to read from (``start``, or past a purge), or None to read nothing (truncated)."""
    if start < rec.start:
        if o.source.fail_on_data_loss:
            raise PurgedError(
                f"recording {rec.key}: positions [{start}, {rec.start}) were purged from the "
                "archive; set failOnDataLoss=false to skip them"
            )
        log.warning("recording %s: skipping purged range [%d, %d)", rec.key, start, rec.start)
        return rec.start
    if start > rec.end:
        if o.source.fail_on_data_loss:
            raise PurgedError(
                f"recording {rec.key} was truncated to {rec.end}, below the offset {start} "
                "already read; set failOnDataLoss=false to skip it"
            )
        log.warning("recording %s: truncated to %d below offset %d", rec.key, rec.end, start)
        return None
    return start


def _partitions(
    o: ArchiveSourceOptions,
    recs: dict[str, ArchivedRecording],
    start: dict[str, int],
    end: dict[str, int],
    fmt: dict,
) -> list[ArchiveRange]:
    parts = []
    for key in sorted(end):
        rec = recs.get(key)
        if rec is None:
            continue
        begin = _check_loss(o, rec, start.get(key, rec.start))
        if begin is None or end[key] <= begin:
            continue
        if end[key] > rec.end:
            raise PositionOutOfRangeError(
                f"recording {key} ends at {rec.end}, before the planned offset {end[key]} "
                "(truncated meanwhile?)"
            )
        d = rec.descriptor
        parts.append(
            ArchiveRange(
                o.connect,
                key,
                d.recording_id,
                d.session_id,
                d.stream_id,
                begin,
                end[key],
                end[key],
                True,
                d.initial_term_id,
                d.term_buffer_length,
                d.start_timestamp_ms * 1_000_000,
                o.source.format == "text",
                **fmt,
                sink_target=is_sink_target(d.original_channel),
            )
        )
    return _split(parts, o.source.min_partitions)


def _split(parts: list[ArchiveRange], min_partitions: int | None) -> list[ArchiveRange]:
    """Cut ranges into about ``min_partitions`` shares, proportionally to their bytes (at least
    one each; deterministic: the same ranges give the same cuts). A cut need not be a frame
    boundary: its task replays from the term boundary at or below it (a frame boundary) and
    keeps the messages that begin in its share."""
    if not min_partitions or len(parts) >= min_partitions or not parts:
        return parts
    total = sum(p.end - p.start for p in parts)
    out: list[ArchiveRange] = []
    for p in parts:
        share = max(1, round(min_partitions * (p.end - p.start) / total))
        cuts = sorted(
            {(p.start + (p.end - p.start) * i // share) & -FRAME_ALIGNMENT for i in range(1, share)}
        )
        bounds = [p.start, *(c for c in cuts if p.start < c < p.end), p.end]
        if len(bounds) == 2:
            out.append(p)
            continue
        out.extend(
            dataclasses.replace(
                p,
                start=a,
                end=b,
                limit=p.end,
                exact=False,
                replay_from=None
                if a == p.start
                else max(p.start, a // p.term_length * p.term_length),
            )
            for a, b in zip(bounds, bounds[1:], strict=False)
        )
    return out


def archive_source_schema(o: ArchiveSourceOptions) -> str | StructType:
    fmt = o.source.format
    if fmt not in ("arrow", "json", "msgpack") or o.source.schema_ddl:
        return source_schema(o.source)
    from pyspark.sql.pandas.types import from_arrow_schema

    recs = list_archived(o)
    with connect(o.connect) as client:
        for rec in sorted(recs.values(), key=lambda r: r.descriptor.recording_id):
            if rec.end <= rec.start:
                continue
            d = rec.descriptor
            replay = client.replay(d.recording_id, rec.start, rec.end)
            try:
                replayed = (
                    _without_markers(replay) if is_sink_target(d.original_channel) else replay
                )
                blocks = (ReplayBlock(b.position, b.data, 0, b.end_position) for b in replayed)
                for message in iter_messages(
                    blocks, Geometry(d.initial_term_id, d.term_buffer_length)
                ):
                    if fmt == "arrow":
                        return from_arrow_schema(
                            formats_arrow.schema_of_payload(message.payload, message.position)
                        )
                    data = infer_schema(fmt, message.payload)
                    s = o.source
                    return from_arrow_schema(
                        full_schema(
                            data, s.bad_records_policy, s.corrupt_record_column, s.include_metadata
                        )
                    )
            finally:
                replay.close()
    raise ConfigurationError(
        "schema",
        None,
        "a schema option (Spark DDL), since the archive's recordings of the "
        "stream hold no message yet",
    )


class ArchiveBatchReader(DataSourceReader):
    """``spark.read.format("aeron").option("archive", ...)``: every recording, to its end."""

    def __init__(self, options: ArchiveSourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self._format = format_fields(options.source, schema)

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        recs = list_archived(o)
        start = _start_positions(o, recs)
        ending = o.source.ending
        if isinstance(ending, dict):
            unknown = set(ending) - set(recs)
            if unknown:
                raise PositionOutOfRangeError(
                    f"endingPositions names recordings the archive does not have for the "
                    f"stream: {sorted(unknown)}"
                )
            end = {k: min(v, recs[k].end) for k, v in ending.items()}
        else:
            end = {k: r.end for k, r in recs.items()}
        return _partitions(o, recs, start, end, self._format)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_archive_range(partition)


class ArchiveStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("aeron").option("archive", ...)``: micro-batches of what the
    archive recorded since the last offset."""

    def __init__(self, options: ArchiveSourceOptions, schema: StructType | None = None) -> None:
        self.options = options
        self._format = format_fields(options.source, schema)
        self._available_now: dict[str, int] | None = None
        self._latest: dict[str, int] = {}

    def initialOffset(self) -> dict:
        o = self.options
        return encode_offset(_start_positions(o, list_archived(o)))

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {k: r.end for k, r in list_archived(self.options).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        s = self.options.source
        if s.max_messages_per_trigger is not None:
            return ReadMaxRows(s.max_messages_per_trigger)
        if s.max_bytes_per_trigger is not None:
            return ReadMaxBytes(s.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        o = self.options
        recs = list_archived(o)
        current = decode_offset(start) if start else {}
        max_messages = max_bytes = None
        if limit is not None and not isinstance(limit, ReadAllAvailable):
            max_messages = o.source.max_messages_per_trigger
            max_bytes = o.source.max_bytes_per_trigger
            if isinstance(limit, ReadMaxRows):
                max_messages = limit.max_rows
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
        ends = dict(current)
        self._latest = {**current, **{k: r.end for k, r in recs.items()}}
        begin: dict[str, int] = {}
        target: dict[str, int] = {}
        for key, rec in recs.items():
            begin[key] = max(current.get(key, rec.start), rec.start)
            latest = rec.end
            if self._available_now is not None:
                latest = min(latest, self._available_now.get(key, begin[key]))
            target[key] = max(latest, begin[key])
            ends[key] = (
                begin[key]
                if key in current or target[key] > begin[key]
                else _start_positions(o, {key: rec})[key]
            )
        waiting = sorted(k for k in target if target[k] > begin[k])
        if waiting:
            with connect(o.connect) as client:
                # The budget is shared evenly between the recordings with data first, then
                # what is left goes to those with more: one backlog never starves the others.
                for second_round in (False, True):
                    if not waiting or max_messages == 0 or max_bytes == 0:
                        break
                    n = len(waiting)
                    for key in list(waiting):
                        if max_messages == 0 or max_bytes == 0:
                            break
                        share_m = (
                            max_messages
                            if second_round or max_messages is None
                            else max(1, max_messages // n)
                        )
                        share_b = (
                            max_bytes
                            if second_round or max_bytes is None
                            else max(1, max_bytes // n)
                        )
                        end, messages = scan(
                            client, recs[key], ends[key], target[key], share_m, share_b
                        )
                        if max_messages is not None:
                            max_messages = max(0, max_messages - messages)
                        if max_bytes is not None:
                            max_bytes = max(0, max_bytes - (end - ends[key]))
                        ends[key] = end
                        if end >= target[key] or messages == 0:
                            waiting.remove(key)
        return encode_offset(ends)

    def reportLatestOffset(self) -> dict | None:
        return encode_offset(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        o = self.options
        recs = list_archived(o)
        begin = decode_offset(start)
        for key, rec in recs.items():
            begin.setdefault(key, rec.start)  # appeared after the start offset: from its start
        return _partitions(o, recs, begin, decode_offset(end), self._format)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        started = time.monotonic()
        rows = 0
        for batch in read_archive_range(partition):
            rows += batch.num_rows
            yield batch
        if isinstance(partition, ArchiveRange):
            log.debug(
                "archive recording %s [%d, %d): %d rows in %.3f s",
                partition.key,
                partition.start,
                partition.end,
                rows,
                time.monotonic() - started,
            )

    def commit(self, end: dict) -> None:
        """Nothing to tell the archive: it keeps no consumer positions."""

    def stop(self) -> None:
        """Sessions are per call; nothing stays open between micro-batches."""


def schema(options: Mapping[str, str]) -> str | StructType:
    return archive_source_schema(parse_archive_source_options(options))


def batch_reader(options: Mapping[str, str], schema: StructType) -> ArchiveBatchReader:
    return ArchiveBatchReader(parse_archive_source_options(options), schema)


def stream_reader(options: Mapping[str, str], schema: StructType) -> ArchiveStreamReader:
    return ArchiveStreamReader(parse_archive_source_options(options), schema)

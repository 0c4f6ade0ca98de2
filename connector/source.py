"""The ``aeron`` source: batch and streaming readers over a stream server's recordings.

Offsets are ``{"<recording_id>": position}`` (JSON object, keys sorted), one entry per recording
of the chosen streams: a recording is a Spark "partition" the way a Kafka partition is. Every
input partition is a small picklable value that carries all a task needs (server settings,
recording id, range, geometry, format); ``read()`` runs on an executor, opens its own session and
replays exactly ``[start, end)``, so a re-run task returns the same rows.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from aeron_spark.connector.client import ClientSettings, RecordingInfo, StreamClient, pooled
from aeron_spark.connector.errors import PositionOutOfRangeError, PurgedError
from aeron_spark.connector.formats import Geometry, batches_from_blocks
from aeron_spark.connector.options import SourceOptions
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

log = logging.getLogger("aeron_spark.connector.source")


@dataclass(frozen=True)
class RecordingRange(InputPartition):
    """One task's work: replay ``[start, end)`` of one recording."""

    settings: ClientSettings
    recording_id: int
    start: int
    end: int
    initial_term_id: int
    term_length: int
    text: bool


def read_range(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RecordingRange):
        # Spark plans one placeholder InputPartition when partitions() returned none (a micro-batch
        # with no new data, e.g. one run only to move the watermark): it holds no rows.
        return
    if partition.end <= partition.start:
        return
    geometry = Geometry(partition.initial_term_id, partition.term_length)
    with pooled(partition.settings) as client:  # Python workers are reused: so are sessions
        blocks = client.replay(partition.recording_id, partition.start, partition.end)
        yield from batches_from_blocks(blocks, partition.recording_id, geometry, partition.text)


def _recordings(options: SourceOptions) -> dict[int, RecordingInfo]:
    with pooled(options.settings) as client:
        return {
            r.recording_id: r for r in client.list_recordings(stream_ids=list(options.stream_ids))
        }


def _start_position(options: SourceOptions, rec: RecordingInfo, client: StreamClient | None) -> int:
    if options.starting_timestamp_ms is not None and client is not None:
        return max(
            rec.purged_position,
            client.position_at(rec.recording_id, options.starting_timestamp_ms * 1_000_000),
        )
    spec = options.starting
    if spec == "latest":
        return rec.recorded_position
    if isinstance(spec, dict) and rec.recording_id in spec:
        return spec[rec.recording_id]
    return rec.purged_position


def _check_loss(options: SourceOptions, rec: RecordingInfo, start: int) -> int:
    """The position to read from: ``start``, or the first readable one when data was purged."""
    if start >= rec.purged_position:
        return start
    if options.fail_on_data_loss:
        raise PurgedError(
            f"recording {rec.recording_id}: positions [{start}, {rec.purged_position}) were purged; "
            "set failOnDataLoss=false to skip them"
        )
    log.warning(
        "recording %d: skipping purged range [%d, %d)", rec.recording_id, start, rec.purged_position
    )
    return rec.purged_position


def _partitions(
    options: SourceOptions,
    recordings: dict[int, RecordingInfo],
    start: dict[int, int],
    end: dict[int, int],
) -> list[RecordingRange]:
    parts = []
    for rid in sorted(end):
        rec = recordings.get(rid)
        if rec is None:
            continue
        begin = _check_loss(options, rec, start.get(rid, rec.start_position))
        if end[rid] > begin:
            parts.append(
                RecordingRange(
                    options.settings,
                    rid,
                    begin,
                    end[rid],
                    rec.initial_term_id,
                    rec.term_length,
                    options.format == "text",
                )
            )
    return parts


def _split(
    client: StreamClient, parts: list[RecordingRange], min_partitions: int | None
) -> list[RecordingRange]:
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
        splits = client.scan(part.recording_id, part.start, part.end, parts=share).splits
        bounds = [part.start, *splits, part.end]
        out.extend(
            dataclasses.replace(part, start=a, end=b)
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        )
    return out


def _limited_ends(
    client: StreamClient,
    begin: dict[int, int],
    target: dict[int, int],
    max_messages: int | None,
    max_bytes: int | None,
) -> tuple[dict[int, int], int]:
    """Ends (message boundaries) of the next micro-batch within the limits, and its message count.

    The budget is shared evenly between recordings with data first, then what is left goes to
    those with more, so one recording's backlog never starves the others."""
    ends = dict(begin)
    waiting = sorted(rid for rid in target if target[rid] > begin.get(rid, target[rid]))
    messages_left = max_messages
    bytes_left = max_bytes
    total = 0
    for rounds in (0, 1):
        if not waiting:
            break
        share_messages = (
            None if messages_left is None else max(1, messages_left // len(waiting))
        )
        share_bytes = None if bytes_left is None else max(1, bytes_left // len(waiting))
        for rid in list(waiting):
            if messages_left is not None and messages_left <= 0:
                break
            if bytes_left is not None and bytes_left <= 0:
                break
            want_messages = messages_left if rounds else share_messages
            want_bytes = bytes_left if rounds else share_bytes
            got = client.scan(
                rid, ends[rid], target[rid], max_messages=want_messages, max_bytes=want_bytes
            )
            total += got.messages
            if messages_left is not None:
                messages_left -= got.messages
            if bytes_left is not None:
                bytes_left -= got.end - ends[rid]
            ends[rid] = got.end
            if got.end >= target[rid] or got.messages == 0:
                waiting.remove(rid)
    return ends, total


def encode_offset(positions: dict[int, int]) -> dict[str, int]:
    return {str(k): positions[k] for k in sorted(positions)}


def decode_offset(offset: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in offset.items()}


class AeronBatchReader(DataSourceReader):
    """``spark.read.format("aeron")``: a bounded read of every recording of the streams."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        with StreamClient.connect(o.settings) as client:
            recordings = {
                r.recording_id: r for r in client.list_recordings(stream_ids=list(o.stream_ids))
            }
            start = {rid: _start_position(o, rec, client) for rid, rec in recordings.items()}
        if isinstance(o.ending, dict):
            unknown = set(o.ending) - set(recordings)
            if unknown:
                raise PositionOutOfRangeError(
                    f"endingPositions names unknown recordings {sorted(unknown)}"
                )
            end = {
                rid: min(pos, recordings[rid].recorded_position) for rid, pos in o.ending.items()
            }
        else:
            end = {rid: rec.recorded_position for rid, rec in recordings.items()}
        with StreamClient.connect(o.settings) as client:
            parts = _partitions(o, recordings, start, end)
            return _split(client, parts, o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


class AeronStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("aeron")``: micro-batches of newly recorded messages.

    Admission control: ``maxMessagesPerTrigger`` / ``maxBytesPerTrigger`` / ``minMessagesPerTrigger``
    become Spark's default read limit; every micro-batch ends on message boundaries the server
    finds (``scan``), so no batch tears a fragmented message. ``Trigger.AvailableNow`` reads up to
    the recorded positions at the time the query starts, in limited batches if limits are set.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._latest: dict[int, int] = {}
        self._available_now: dict[int, int] | None = None
        self._last_batch = time.monotonic()

    def initialOffset(self) -> dict:
        o = self.options
        with StreamClient.connect(o.settings) as client:
            recordings = client.list_recordings(stream_ids=list(o.stream_ids))
            return encode_offset(
                {r.recording_id: _start_position(o, r, client) for r in recordings}
            )

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {
            rid: rec.recorded_position for rid, rec in _recordings(self.options).items()
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
        target: dict[int, int] = {}
        for rid, rec in recordings.items():
            # Scan from the first readable position; a purged gap is partitions()' business
            # (failOnDataLoss), so it fails or is skipped there, not here.
            begin[rid] = max(begin.get(rid, rec.start_position), rec.purged_position)
            latest = rec.recorded_position
            if self._available_now is not None:
                latest = min(latest, self._available_now.get(rid, begin[rid]))
            target[rid] = max(latest, begin[rid])
        self._latest = {**current, **{rid: recordings[rid].recorded_position for rid in recordings}}
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
        with pooled(o.settings) as client:
            ends, messages = _limited_ends(client, begin, target, max_messages, max_bytes)
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
                sum(self._latest[r] - ends[r] for r in recordings),
            )
        for rid, pos in current.items():
            ends.setdefault(rid, pos)  # a recording no longer listed keeps its offset
        return encode_offset(ends)

    def reportLatestOffset(self) -> dict | None:
        return encode_offset(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        recordings = _recordings(self.options)
        begin = decode_offset(start)
        for rid in recordings:
            # A recording that appeared after the start offset was taken starts at its beginning.
            begin.setdefault(rid, recordings[rid].start_position)
        parts = _partitions(self.options, recordings, begin, decode_offset(end))
        if not self.options.min_partitions or len(parts) >= self.options.min_partitions:
            return parts
        with pooled(self.options.settings) as client:
            return _split(client, parts, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        started = time.monotonic()
        rows = 0
        for batch in read_range(partition):
            rows += batch.num_rows
            yield batch
        log.debug(
            "recording %d [%d, %d): %d rows in %.3f s",
            partition.recording_id,
            partition.start,
            partition.end,
            rows,
            time.monotonic() - started,
        )

    def commit(self, end: dict) -> None:
        """Nothing to release: the server keeps recordings until a retention purge."""

    def stop(self) -> None:
        """Sessions are per call; nothing stays open between micro-batches."""

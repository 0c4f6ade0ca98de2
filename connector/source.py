"""The ``aeron`` source: batch and streaming readers over a stream server's recordings.

Offsets are ``{"<recording_id>": position}`` (JSON object, keys sorted), one entry per recording
of the chosen streams: a recording is a Spark "partition" the way a Kafka partition is. Every
input partition is a small picklable value that carries all a task needs (server settings,
recording id, range, geometry, format); ``read()`` runs on an executor, opens its own session and
replays exactly ``[start, end)``, so a re-run task returns the same rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from aeron_spark.connector.client import ClientSettings, RecordingInfo, StreamClient
from aeron_spark.connector.errors import PositionOutOfRangeError, PurgedError
from aeron_spark.connector.formats import Geometry, batches_from_blocks
from aeron_spark.connector.options import SourceOptions
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

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
    with StreamClient.connect(partition.settings) as client:
        blocks = client.replay(partition.recording_id, partition.start, partition.end)
        yield from batches_from_blocks(blocks, partition.recording_id, geometry, partition.text)


def _recordings(options: SourceOptions) -> dict[int, RecordingInfo]:
    with StreamClient.connect(options.settings) as client:
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
        return _partitions(o, recordings, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


class AeronStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("aeron")``: micro-batches of newly recorded messages."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._latest: dict[int, int] = {}

    def initialOffset(self) -> dict:
        o = self.options
        with StreamClient.connect(o.settings) as client:
            recordings = client.list_recordings(stream_ids=list(o.stream_ids))
            return encode_offset(
                {r.recording_id: _start_position(o, r, client) for r in recordings}
            )

    def latestOffset(self, start: dict | None = None, limit: object | None = None) -> dict:
        recordings = _recordings(self.options)
        current = decode_offset(start) if start else {}
        latest = dict(current)
        for rid, rec in recordings.items():
            latest[rid] = max(rec.recorded_position, current.get(rid, 0))
        lag = sum(latest[r] - current.get(r, recordings[r].start_position) for r in recordings)
        if lag:
            log.info(
                "aeron source streams %s: %d recordings, %d bytes behind the latest position",
                list(self.options.stream_ids),
                len(recordings),
                lag,
            )
        self._latest = latest
        return encode_offset(latest)

    def reportLatestOffset(self) -> dict | None:
        return encode_offset(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        recordings = _recordings(self.options)
        begin = decode_offset(start)
        for rid in recordings:
            # A recording that appeared after the start offset was taken starts at its beginning.
            begin.setdefault(rid, recordings[rid].start_position)
        return _partitions(self.options, recordings, begin, decode_offset(end))

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

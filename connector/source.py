"""The ``aeron`` source: batch and streaming readers over the recordings of log stores.

Written once over the store contract (:mod:`~aeron_spark.connector.stores`): a stream server
(:mod:`.stores.server`, one store per ``endpoint``), an Aeron Archive (:mod:`.stores.archive`,
``archive=...``) or a set of archive replicas (:mod:`.stores.replicas`, ``archive`` naming
several control channels). Offsets are ``{"<key>": position}`` (JSON object, keys sorted), one
entry per recording of the chosen streams: a recording is a Spark "partition" the way a Kafka
partition is. Its key is the store's (``"<recording_id>"`` with one server,
``"<endpoint>/<recording_id>"`` with several, ``"<archiveId>/<recording_id>"`` for an archive,
the identity a recording's copies share for a set of replicas). Every input partition is a small
picklable value that carries all a task needs (its store, recording id, range, geometry,
format); ``read()`` runs on an executor and reads exactly ``[start, end)`` through its store, so a
re-run task returns the same rows.

With ``readOn=driver`` the streaming reader is :class:`AeronDriverStreamReader` instead: the
driver replays each micro-batch's ranges while it plans the batch, and Spark hands those rows to
its tasks from the block manager (its prefetching path for Python sources), so a micro-batch costs
no Python worker at all: the lowest latency, for streams light enough to pass through the driver.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
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
from aeron_spark.connector.errors import (
    PositionOutOfRangeError,
    PurgedError,
    ReplicasUnavailableError,
)
from aeron_spark.connector.formats import (
    BINARY_SCHEMA_DDL,
    TEXT_SCHEMA_DDL,
    Geometry,
    batches_from_blocks,
    iter_messages,
)
from aeron_spark.connector.options import ArchiveSourceOptions, SourceOptions
from aeron_spark.connector.pushdown import Pushed, push_filters
from aeron_spark.connector.session.budget import share_budget
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.stores import (
    Budget,
    LogStore,
    Recording,
    RecordingRange,
    StoreSession,
)
from aeron_spark.connector.stores.server import ServerRange, ServerStore
from aeron_spark.errors import ConfigurationError

log = logging.getLogger("aeron_spark.connector.source")

# A read task's Python worker imports this module (its reader is pickled by reference): what
# only planning or another format needs (the archive stores, the SBE and record codecs) is
# imported where it is used (issue 31 item 2: the worker's modules are walked by the
# gc.collect() Spark's reused worker runs after every task).

__all__ = [
    "AeronBatchReader",
    "AeronDriverStreamReader",
    "AeronFilteringBatchReader",
    "AeronStreamReader",
    "PackedRanges",
    "RecordingRange",
    "ServerRange",
    "pack_bounds",
    "pack_ranges",
    "ranges_of",
    "read_range",
    "source_schema",
    "stores_of",
]


def stores_of(options: SourceOptions | ArchiveSourceOptions) -> tuple[SourceOptions, tuple]:
    """The reader options and the stores they name (each server of ``endpoint``, the archive
    of ``archive``, or the set of replicas when ``archive`` names several)."""
    if isinstance(options, ArchiveSourceOptions):
        from aeron_spark.connector.stores.archive import ArchiveStore
        from aeron_spark.connector.stores.replicas import ReplicaStore

        if options.replicas:  # several archives: one store, the set of replicas
            archives = tuple(ArchiveStore(c, options.channel) for c in options.connects)
            return options.source, (ReplicaStore(archives, options.recheck_interval_s),)
        return options.source, (ArchiveStore(options.connect, options.channel),)
    several = len(options.all_settings) > 1
    return options, tuple(
        ServerStore(s, options.local_reads, several) for s in options.all_settings
    )


@dataclass(frozen=True)
class PackedRanges(InputPartition):
    """Several recording ranges one task reads, one after the other, in order (many small
    recordings: each task costs Spark's reused Python worker a ``gc.collect()`` and the reader
    its setup, so one task a small range read 1,000,000 messages over 256 recordings at 72 k
    rows/s, issue 31 item 2). Planned by :func:`pack_ranges`; the same offsets give the same
    packs, so a re-run task returns the same rows."""

    ranges: tuple[RecordingRange, ...]


def ranges_of(partition: InputPartition) -> tuple[RecordingRange, ...]:
    """The recording ranges an input partition holds (none: Spark's placeholder)."""
    if isinstance(partition, PackedRanges):
        return partition.ranges
    if isinstance(partition, RecordingRange):
        return (partition,)
    # Spark plans one placeholder InputPartition when partitions() returned none (a micro-batch
    # with no new data, e.g. one run only to move the watermark): it holds no rows.
    return ()


def read_range(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of an input partition's ranges, in order: each store's consecutive ranges read
    through one :meth:`~aeron_spark.connector.stores.LogStore.read_many` (one request to a
    stream server for a packed partition's ranges)."""
    for store, group in itertools.groupby(ranges_of(partition), key=lambda p: p.store):
        parts = [p for p in group if p.end > p.start]
        if not parts:
            continue
        with store.read_many(parts) as each:
            for p, blocks in zip(parts, each, strict=True):
                yield from _rows(p, blocks)
    settle_worker()


_settled = False


def settle_worker() -> None:
    """Once per Spark Python worker, after its first read task: everything the worker then holds
    (Spark's modules, ours, pyarrow's, the pooled session) is moved out of the cyclic collector's
    way (``gc.freeze``), so the ``gc.collect()`` Spark's reused worker runs after every task no
    longer walks it (issue 31 item 2: ~48 ms of CPU a task, 91,000 objects, 34 ms of them
    Spark's own). Objects alive then are never collected as cyclic garbage: a one-time cost of a
    few objects. Nothing outside a Spark task (the driver's ``readOn=driver`` reads)."""
    global _settled
    if _settled or TaskContext.get() is None:
        return
    _settled = True
    gc.collect()
    gc.freeze()


def _rows(p: RecordingRange, blocks: Iterator[ReplayBlock]) -> Iterator[pa.RecordBatch]:
    """The rows of ``p``'s blocks in its format."""
    geometry = Geometry(p.initial_term_id, p.term_length)
    if p.arrow_schema is not None:
        schema = pa.ipc.read_schema(pa.py_buffer(p.arrow_schema))
        yield from formats_arrow.batches_from_blocks(blocks, geometry, schema)
    elif p.sbe is not None:
        from aeron_spark.connector.formats_sbe import SbeBatches

        yield from SbeBatches(p.sbe, p.recording_id).batches(blocks, geometry)
    elif p.decoding is not None:
        from aeron_spark.connector.formats_records import RecordDecoder

        yield from RecordDecoder(p.decoding, p.recording_id).batches(blocks, geometry)
    else:
        try:
            yield from batches_from_blocks(blocks, p.recording_id, geometry, p.text)
        except pa.ArrowInvalid as exc:  # text: invalid UTF-8 (the vectorised path)
            from aeron_spark.connector.formats_records import BadRecordError

            raise BadRecordError(
                f"recording {p.key} holds a message in [{p.start}, {p.end}) that is not "
                f"UTF-8 text ({exc}); set badRecordsPolicy to drop or column to read past "
                "bad records"
            ) from exc


class _Sessions(ExitStack):
    """One session per store, opened when first needed, for one planning call."""

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[Any, StoreSession] = {}

    def of(self, store: LogStore) -> StoreSession:
        session = self._open.get(store)
        if session is None:
            session = self._open[store] = self.enter_context(store.session())
        return session


def _recordings(o: SourceOptions, stores: Sequence[LogStore]) -> dict[str, Recording]:
    out: dict[str, Recording] = {}
    for store in stores:
        with store.session() as session:
            for rec in session.recordings(o.stream_ids):
                out[rec.key] = rec
    return out


def _start_positions(o: SourceOptions, recordings: dict[str, Recording]) -> dict[str, int]:
    by_time = o.starting_by_timestamp or {}
    spec = o.starting
    out: dict[str, int] = {}
    with _Sessions() as sessions:
        for key, rec in recordings.items():
            ts_ms = o.starting_timestamp_ms
            if ts_ms is None:
                ts_ms = by_time.get(key)
            if ts_ms is not None:
                at = sessions.of(rec.store).position_at(rec, ts_ms * 1_000_000)
                out[key] = max(rec.purged, at)
            elif spec == "latest":
                out[key] = rec.end
            elif isinstance(spec, dict) and key in spec:
                out[key] = spec[key]
            else:
                out[key] = rec.purged
    return out


def _positions_at(recordings: dict[str, Recording], timestamp_ms: int) -> dict[str, int]:
    """Each recording's first position recorded at or after the time (its time index)."""
    out: dict[str, int] = {}
    with _Sessions() as sessions:
        for key, rec in recordings.items():
            at = sessions.of(rec.store).position_at(rec, timestamp_ms * 1_000_000)
            out[key] = max(rec.purged, at)
    return out


def _narrow(
    pushed: Pushed, recordings: dict[str, Recording], start: dict[str, int], end: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Start and end positions cut to the pushed filters (message boundaries still)."""
    start, end = dict(start), dict(end)
    with _Sessions() as sessions:
        for key in sorted(end):
            rec = recordings.get(key)
            if rec is None:
                continue
            begin = max(start.get(key, rec.start), rec.purged)
            if end[key] <= begin:
                continue
            start[key], end[key] = sessions.of(rec.store).narrow(pushed, rec, begin, end[key])
    return start, end


def _check_loss(o: SourceOptions, rec: Recording, start: int) -> int | None:
    """Where to read from: ``start``, the first readable position when data below it was
    purged, or None (nothing to read) when the recording was truncated below ``start``, or
    when a set of archives does not confirm it that far yet (a sink's target with fewer
    archives answering than its ``minInSyncReplicas``: the set's end is held back, not cut)."""
    if start < rec.purged:
        if o.fail_on_data_loss:
            raise PurgedError(
                f"recording {rec.key}: positions [{start}, {rec.purged}) were purged; "
                "set failOnDataLoss=false to skip them"
            )
        log.warning("recording %s: skipping purged range [%d, %d)", rec.key, start, rec.purged)
        return rec.purged
    if start > rec.end:
        if start <= rec.held:  # a set of archives that cannot confirm it yet: not a loss
            log.debug(
                "recording %s: offset %d is past what enough archives confirm (%d); "
                "nothing read from it until they do",
                rec.key,
                start,
                rec.end,
            )
            return None
        if o.fail_on_data_loss:
            raise PurgedError(
                f"recording {rec.key} was truncated to {rec.end}, below the offset {start} "
                "already read; set failOnDataLoss=false to skip it"
            )
        log.warning("recording %s: truncated to %d below offset %d", rec.key, rec.end, start)
        return None
    return start


def _confirmed_partitions(
    o: SourceOptions, stores: Sequence[LogStore], start: dict, end: dict
) -> list[RecordingRange]:
    """A streaming batch's ranges from ``start`` to ``end`` (offsets ``latestOffset`` gave).
    A range planned while ``minInSyncReplicas`` archives of a set confirmed it, that fewer
    confirm now (an archive restarting, a partition), is waited for: the recordings are listed
    again (every 0.2 s, doubling up to 2 s) until enough archives answer, for ``timeoutMs`` at
    most (the source's bound on every wait); then :class:`ReplicasUnavailableError`, as before.
    Nothing is read meanwhile: waiting never delivers a batch fewer archives confirm."""
    deadline = time.monotonic() + o.settings.timeout_s
    delay = 0.2
    waited = False
    while True:
        recordings = _recordings(o, stores)
        begin = decode_offset(start)
        for key, rec in recordings.items():
            # A recording that appeared after the start offset was taken starts at its beginning.
            begin.setdefault(key, rec.start)
        try:
            parts = _partitions(o, recordings, begin, decode_offset(end))
        except ReplicasUnavailableError as exc:
            if time.monotonic() + delay > deadline:
                raise
            if not waited:
                log.warning("%s; waiting up to %g s (timeoutMs)", exc, o.settings.timeout_s)
                waited = True
            time.sleep(delay)
            delay = min(2 * delay, 2.0)
            continue
        if waited:
            log.warning("a planned batch is confirmed again by enough archives: read")
        return parts


def _partitions(
    o: SourceOptions,
    recordings: dict[str, Recording],
    start: dict[str, int],
    end: dict[str, int],
) -> list[RecordingRange]:
    parts = []
    for key in sorted(end):
        rec = recordings.get(key)
        if rec is None:
            continue
        if rec.end < end[key] <= rec.held and start.get(key, rec.start) < end[key]:
            # planned when enough archives held it; fewer answer now (the range is there, on
            # too few of them to know it is the acknowledged one): no rows yet, not a loss
            raise ReplicasUnavailableError(
                f"recording {key}: the planned offset {end[key]} is past what enough archives "
                f"of the set confirm now ({rec.end}; a copy holds {rec.held}, but its batches "
                f"need minInSyncReplicas={rec.insync} archives holding them the same): retry "
                "once they answer",
                archives={
                    channel: "holds a copy, cannot confirm it alone"
                    if channel in rec.holders
                    else "did not answer, or holds no copy"
                    for channel in getattr(rec.store, "control_channels", rec.holders)
                },
            )
        begin = _check_loss(o, rec, start.get(key, rec.start))
        if begin is None or end[key] <= begin:
            continue
        if end[key] > rec.end:
            raise PositionOutOfRangeError(
                f"recording {key} ends at {rec.end}, before the planned offset {end[key]} "
                "(truncated meanwhile?)"
            )
        parts.append(rec.store.partition(rec, begin, end[key], o.format == "text"))
    return parts


def split_ranges(parts: list[RecordingRange], min_partitions: int | None) -> list[RecordingRange]:
    """Ranges cut by their stores into about ``min_partitions`` shares, each recording's share
    proportional to its bytes (deterministic: recorded data never changes)."""
    if not min_partitions or len(parts) >= min_partitions or not parts:
        return parts
    total = sum(p.end - p.start for p in parts)
    out: list[RecordingRange] = []
    for part in parts:
        share = max(1, round(min_partitions * (part.end - part.start) / total))
        out.extend([part] if share == 1 else part.store.split(part, share))
    return out


def _greedy(sizes: Sequence[int], cap: int, need: int = 0) -> list[tuple[int, int]]:
    """Consecutive groups filled in order up to ``cap`` bytes (a larger range alone), and a new
    group for each range left when fewer would not make ``need`` groups."""
    n = len(sizes)
    out: list[tuple[int, int]] = []
    first = held = 0
    for i, size in enumerate(sizes):
        if i > first and (held + size > cap or len(out) + n - i < need):
            out.append((first, i))
            first, held = i, 0
        held += size
    out.append((first, n))
    return out


def pack_bounds(
    sizes: Sequence[int], max_bytes: int, min_partitions: int | None = None
) -> list[tuple[int, int]]:
    """Consecutive ranges of ``sizes`` (bytes, each > 0) grouped into input partitions, as
    ``(first, stop)`` index pairs covering every range once, in order.

    As few groups as hold at most ``max_bytes`` each (a larger range is a group of its own), at
    least ``min_partitions`` when there are that many ranges, and even: the smallest cap that
    still gives that many groups (no small tail). Pure and deterministic: the same ranges give
    the same groups."""
    n = len(sizes)
    if n == 0:
        return []
    need = min(n, min_partitions or 1)
    groups = max(need, len(_greedy(sizes, max_bytes)))
    hi = max_bytes
    lo = min(hi, max(1, -(-sum(sizes) // groups)))
    while lo < hi:  # the smallest cap that gives no more groups (fewer groups as it grows)
        mid = (lo + hi) // 2
        if len(_greedy(sizes, mid)) <= groups:
            hi = mid
        else:
            lo = mid + 1
    return _greedy(sizes, hi, need)


def pack_ranges(
    parts: list[RecordingRange], max_bytes: int, min_partitions: int | None = None
) -> list[InputPartition]:
    """``parts`` (in order) packed into input partitions by :func:`pack_bounds`: a group of
    one is the range itself, a larger one a :class:`PackedRanges`."""
    out: list[InputPartition] = []
    for first, stop in pack_bounds([p.end - p.start for p in parts], max_bytes, min_partitions):
        out.append(parts[first] if stop - first == 1 else PackedRanges(tuple(parts[first:stop])))
    return out


def _limited_ends(
    recordings: dict[str, Recording],
    begin: dict[str, int],
    target: dict[str, int],
    max_messages: int | None,
    max_bytes: int | None,
    min_messages: int | None,
) -> tuple[dict[str, int], int, bool]:
    """Ends (message boundaries) of the next micro-batch within the limits, its message count,
    and whether it holds at least ``min_messages`` (True without a minimum).

    The budget is shared evenly between recordings with data first, then what is left goes to
    those with more, so one recording's backlog never starves the others."""
    ends = dict(begin)
    waiting = sorted(key for key in target if target[key] > begin.get(key, target[key]))
    total = 0
    counted = True
    with _Sessions() as sessions:
        if max_messages is None and max_bytes is None and min_messages is None and waiting:
            # No limit needs a count: each recording's last message boundary, from the store's
            # catalog in one request (issue 31 item 3); what it cannot answer is scanned below.
            counted = False
            by_store: dict[Any, list[Recording]] = {}
            for key in waiting:
                by_store.setdefault(recordings[key].store, []).append(recordings[key])
            for store, recs in by_store.items():
                found = sessions.of(store).message_ends(recs) or {}
                for key, end in found.items():
                    if begin[key] <= end <= target[key] and target[key] == recordings[key].end:
                        ends[key] = end
                        waiting.remove(key)
        if waiting:
            for end, messages, key in _scan_waiting(
                sessions, recordings, waiting, ends, target, Budget(max_messages, max_bytes)
            ):
                ends[key] = end
                if messages < 0:  # not counted: no budget, the store read nothing
                    counted = False
                else:
                    total += messages
        if min_messages is None:
            return ends, total, True
        if counted:
            return ends, total, total >= min_messages
        # a store that does not count unlimited scans: count up to the minimum, no further
        have = 0
        for key in sorted(ends):
            if have >= min_messages or ends[key] <= begin.get(key, ends[key]):
                continue
            rec = recordings[key]
            _, messages = sessions.of(rec.store).scan(
                rec, begin[key], ends[key], Budget(min_messages - have)
            )
            have += messages
        return ends, total, have >= min_messages


def _scan_waiting(
    sessions: _Sessions,
    recordings: dict[str, Recording],
    waiting: list[str],
    begin: dict[str, int],
    target: dict[str, int],
    budget: Budget,
) -> list[tuple[int, int, str]]:
    """``(end, messages, key)`` of each waiting recording within one budget shared between
    them (:func:`~aeron_spark.connector.session.budget.share_budget`): the store's
    ``scan_ranges`` when one store holds them all (one request to a stream server), else one
    scan per recording through its own store's session."""
    ranges = [(recordings[key], begin[key], target[key]) for key in waiting]
    stores = {rec.store for rec, _, _ in ranges}
    if len(stores) == 1:
        found = sessions.of(stores.pop()).scan_ranges(ranges, budget)
    else:

        def scan_one(
            i: int, start: int, end: int, messages: int | None, nbytes: int | None
        ) -> tuple[int, int]:
            rec = ranges[i][0]
            return sessions.of(rec.store).scan(rec, start, end, Budget(messages, nbytes))

        found = share_budget(
            [(start, end) for _, start, end in ranges], budget.messages, budget.bytes, scan_one
        )
    return [(end, messages, key) for (end, messages), key in zip(found, waiting, strict=True)]


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

    from aeron_spark.connector.formats_records import Decoding, data_columns
    from aeron_spark.connector.formats_sbe import SbeRead

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


def source_schema(options: SourceOptions | ArchiveSourceOptions) -> str | StructType:
    """The rows' schema for ``DataSource.schema()``: given (``schema``) or inferred."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from aeron_spark.connector.formats_records import full_schema, output_ddl
    from aeron_spark.connector.formats_sbe import source_arrow_schema

    options, stores = stores_of(options)
    fmt = options.format
    if fmt in ("binary", "text"):
        ddl = TEXT_SCHEMA_DDL if fmt == "text" else BINARY_SCHEMA_DDL
        if fmt == "text" and options.bad_records_policy == "column":
            ddl += f", `{options.corrupt_record_column}` binary"
        return ddl
    if fmt == "arrow":
        return options.schema_ddl or from_arrow_schema(first_message_schema(options, stores))
    if fmt == "sbe" and options.sbe is not None:
        return from_arrow_schema(source_arrow_schema(options.sbe, options.include_metadata))
    policy, column = options.bad_records_policy, options.corrupt_record_column
    if options.schema_ddl:
        return output_ddl(options.schema_ddl, policy, column, options.include_metadata)
    data = first_message_schema(options, stores)
    return from_arrow_schema(full_schema(data, policy, column, options.include_metadata))


def first_message_schema(options: SourceOptions, stores: Sequence[LogStore]) -> pa.Schema:
    """The schema of the first message of the streams (no ``schema`` option given)."""
    from aeron_spark.connector.formats_records import infer_schema

    for store in stores:
        with store.session() as session:
            for rec in session.recordings(options.stream_ids):
                start = max(rec.start, rec.purged)
                if rec.end <= start:
                    continue
                end, _ = session.scan(rec, start, rec.end, Budget(messages=1))
                geometry = Geometry(rec.initial_term_id, rec.term_length)
                with session.replay(rec, start, end) as blocks:
                    for message in iter_messages(blocks, geometry):
                        if options.format == "arrow":
                            return formats_arrow.schema_of_payload(
                                message.payload, message.position
                            )
                        return infer_schema(options.format, message.payload)
    raise ConfigurationError(
        "schema", None, "a schema option (Spark DDL), since the streams hold no message yet"
    )


class AeronBatchReader(DataSourceReader):
    """``spark.read.format("aeron")``: a bounded read of every recording of the streams."""

    def __init__(
        self, options: SourceOptions | ArchiveSourceOptions, schema: StructType | None = None
    ) -> None:
        self.options, self.stores = stores_of(options)
        self._format = format_fields(self.options, schema)
        self._pushed = Pushed()

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        recordings = _recordings(o, self.stores)
        if self._pushed.sets:
            recordings = {k: r for k, r in recordings.items() if self._pushed.keeps(r)}
        start = _start_positions(o, recordings)
        if o.ending_timestamp_ms is not None:
            end = _positions_at(recordings, o.ending_timestamp_ms)
            end = {k: min(p, recordings[k].end) for k, p in end.items()}
        elif isinstance(o.ending, dict):
            unknown = set(o.ending) - set(recordings)
            if unknown:
                raise PositionOutOfRangeError(
                    f"endingPositions names unknown recordings {sorted(unknown)}"
                )
            end = {key: min(pos, recordings[key].end) for key, pos in o.ending.items()}
        else:
            end = {key: rec.end for key, rec in recordings.items()}
        if not self._pushed.empty:
            start, end = _narrow(self._pushed, recordings, start, end)
        parts = split_ranges(_partitions(o, recordings, start, end), o.min_partitions)
        parts = _with_format(parts, self._format)
        return pack_ranges(parts, o.max_partition_bytes, o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


class AeronFilteringBatchReader(AeronBatchReader):
    """:class:`AeronBatchReader` taking Spark's filters (``spark.sql.python.filterPushdown.
    enabled=true``; Spark refuses a reader with ``pushFilters`` while that is off, so the data
    source hands this one only when it is on, and only over stores that answer filters)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Narrow the read by what the store can answer (see :mod:`.pushdown`); with the
        metadata columns only (``format=binary/text``, or ``includeMetadata``). Every filter is
        returned: Spark still applies it to the rows read."""
        o = self.options
        if not all(s.pushdown for s in self.stores):
            return filters
        if o.format in ("binary", "text") or (o.include_metadata and o.format != "arrow"):
            return push_filters(self._pushed, filters)
        return filters


class AeronStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("aeron")``: micro-batches of newly recorded messages.

    Admission control: ``maxMessagesPerTrigger`` / ``maxBytesPerTrigger`` /
    ``minMessagesPerTrigger`` (with ``maxTriggerDelayMs``) become Spark's default read limit;
    every micro-batch ends on message boundaries the store finds (``scan``), so no batch tears a
    fragmented message. ``Trigger.AvailableNow`` reads up to the recorded positions at the time
    the query starts, in limited batches if limits are set.
    """

    def __init__(
        self, options: SourceOptions | ArchiveSourceOptions, schema: StructType | None = None
    ) -> None:
        self.options, self.stores = stores_of(options)
        self._format = format_fields(self.options, schema)
        self._latest: dict[str, int] = {}
        self._available_now: dict[str, int] | None = None
        self._last_batch = time.monotonic()

    def initialOffset(self) -> dict:
        o = self.options
        return encode_offset(_start_positions(o, _recordings(o, self.stores)))

    def prepareForTriggerAvailableNow(self) -> None:
        recordings = _recordings(self.options, self.stores)
        self._available_now = {key: rec.end for key, rec in recordings.items()}

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
        recordings = _recordings(o, self.stores)
        current = decode_offset(start) if start else {}
        begin = dict(current)
        target: dict[str, int] = {}
        for key, rec in recordings.items():
            # Scan from the first readable position; a purged gap is partitions()' business
            # (failOnDataLoss), so it fails or is skipped there, not here.
            begin[key] = max(begin.get(key, rec.start), rec.purged)
            latest = rec.end
            if self._available_now is not None:
                latest = min(latest, self._available_now.get(key, begin[key]))
            target[key] = max(latest, begin[key])
        self._latest = {**current, **{k: r.end for k, r in recordings.items()}}
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
        if self._available_now is not None:
            min_messages = None  # AvailableNow reads what there is
        ends, messages, enough = _limited_ends(
            recordings, begin, target, max_messages, max_bytes, min_messages
        )
        if not enough:
            waited_ms = (time.monotonic() - self._last_batch) * 1000
            if waited_ms < o.max_trigger_delay_ms:
                return encode_offset(current) if start else encode_offset(begin)
        moved = messages > 0 or any(ends[k] > begin[k] for k in recordings)
        if moved:
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
        o = self.options
        parts = split_ranges(_confirmed_partitions(o, self.stores, start, end), o.min_partitions)
        parts = _with_format(parts, self._format)
        return pack_ranges(parts, o.max_partition_bytes, o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        started = time.monotonic()
        rows = 0
        for batch in read_range(partition):
            rows += batch.num_rows
            yield batch
        parts = ranges_of(partition)
        log.debug(
            "%d ranges (first recording %s): %d rows in %.3f s",
            len(parts),
            parts[0].key if parts else "-",
            rows,
            time.monotonic() - started,
        )

    def commit(self, end: dict) -> None:
        """With a ``consumerId``: tell each server how far this query has processed its
        recordings, so its retention may purge below (and keeps what is above). Best effort: a
        server that cannot be told is logged, not fatal (its retention then keeps more, or, if it
        ignores consumers, ``failOnDataLoss`` reports what was purged unread). A store that keeps
        no consumers (an archive) is told nothing (options refuse ``consumerId`` there)."""
        o = self.options
        if o.consumer_id is None:
            return
        offsets = decode_offset(end)
        for store in self.stores:
            if not store.consumers:
                continue
            try:
                with store.session() as session:
                    session.commit_consumer(o.consumer_id, o.stream_ids, offsets)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                log.warning(
                    "aeron source: could not commit consumer %r positions to %s: %s",
                    o.consumer_id,
                    store.settings.endpoint if isinstance(store, ServerStore) else store.name,
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

    def __init__(
        self, options: SourceOptions | ArchiveSourceOptions, schema: StructType | None = None
    ) -> None:
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

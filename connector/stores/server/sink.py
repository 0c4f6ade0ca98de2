"""The stream server as a :class:`~aeron_spark.connector.stores.SinkStore`: its stage/commit
protocol.

Each task stages its rows on the server under (sinkId, batch id, partition id, attempt) and
returns the staging receipt as its commit message; the driver's ``commit`` asks the server to
append every named part, in partition order, once per (sinkId, batch id). A retried or
speculative task stages under another attempt that no commit names (garbage-collected by lease),
and a batch committed twice after a restart is appended once: the server's commit is idempotent.
A routing sink (a ``stream_id`` column, no ``streamId``) stages one part per stream and commits
them all at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage

from aeron_spark.connector.client import StreamClient, pooled
from aeron_spark.connector.formats import payload_run_from_batch
from aeron_spark.connector.formats_sbe import encode_task
from aeron_spark.connector.options import ROUTING_COLUMN, SinkOptions
from aeron_spark.connector.stores.tasks import sink_payloads, task_attempt
from aeron_spark.errors import ConfigurationError

log = logging.getLogger("aeron_spark.connector.sink")


@dataclass
class StagedPart(WriterCommitMessage):
    receipt: dict = field(default_factory=dict)
    routed: list[dict] = field(default_factory=list)  # routing by stream_id: a part per stream


def _stage_part(
    client: StreamClient,
    options: SinkOptions,
    key: tuple[str, int, int, int],
    stream_id: int,
    batches: Iterator[pa.RecordBatch],
) -> dict:
    """Stage the rows of ``batches`` as one part of ``stream_id``; its commit message."""
    if options.sbe is None and options.format in ("binary", "text"):
        # one payload run per Arrow batch (its reserved values with it): no Python object
        # per row on the local path
        runs = (payload_run_from_batch(batch) for batch in batches)
        return client.stage(*key, stream_id, runs, None, local=options.local_writes)

    def payloads() -> Iterator[bytes]:  # sbe, arrow and the record formats: no reserved
        if options.sbe is not None:  # every row checked before anything is staged
            yield from encode_task(batches, options.sbe)
            return
        for batch in batches:
            yield from sink_payloads(batch, options.format, options.compression)[0]

    return client.stage(*key, stream_id, payloads(), None, local=options.local_writes)


def route_by_stream_id(batches: Iterator[pa.RecordBatch]) -> dict[int, list[pa.RecordBatch]]:
    """The rows of ``batches`` by their ``stream_id`` column (dropped: the stream carries it),
    in order within each stream. A null or non-int32 stream id fails naming the column."""
    groups: dict[int, list[pa.RecordBatch]] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        column = batch.column(batch.schema.get_field_index(ROUTING_COLUMN))
        if column.null_count:
            raise ConfigurationError(
                ROUTING_COLUMN, None, "a stream id in every row (a null one cannot be routed)"
            )
        low, high = pc.min_max(column).values()
        if not -(2**31) <= low.as_py() <= high.as_py() < 2**31:
            raise ConfigurationError(
                ROUTING_COLUMN, f"{low.as_py()}..{high.as_py()}", "32-bit stream ids"
            )
        rows = batch.drop_columns([ROUTING_COLUMN])
        if low.as_py() == high.as_py():  # one stream: no filter
            groups.setdefault(int(low.as_py()), []).append(rows)
            continue
        for stream_id in pc.unique(column).to_pylist():
            groups.setdefault(int(stream_id), []).append(
                rows.filter(pc.equal(column, pa.scalar(stream_id, column.type)))
            )
    return groups


def _receipts(messages: list) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if isinstance(m, StagedPart):
            out += ([m.receipt] if m.receipt else []) + m.routed
    return out


@dataclass(frozen=True, slots=True)
class ServerSink:
    """The sink's side of one stream server (``options.settings.endpoint``)."""

    options: SinkOptions
    name = "stream server"

    def stage(self, identity: str, batch_id: int, rows: Iterator[pa.RecordBatch]) -> StagedPart:
        options = self.options
        partition_id, attempt = task_attempt()
        key = (identity, batch_id, partition_id, attempt)
        # A pooled session: Python workers are reused across tasks and micro-batches, so the
        # handshake and the session's buffers are paid once per worker, not once per task.
        with pooled(options.settings) as client:
            if not options.route_by_stream_id:
                return StagedPart(_stage_part(client, options, key, options.stream_id, rows))
            # one part per stream, staged one after another: the task's rows are held (as
            # Arrow) until all of them are routed
            groups = route_by_stream_id(rows)
            receipts = [
                _stage_part(client, options, key, stream_id, iter(groups[stream_id]))
                for stream_id in sorted(groups)
            ]
        return StagedPart(routed=receipts)

    def commit(self, identity: str, batch_id: int, messages: list, repeated: str | None) -> None:
        """``repeated``: why this (identity, batch) may have been committed before (the
        server then appends nothing, warned about), None: a batch write without ``batchId``."""
        # The stream a commit names: the sink's, or None for a routing sink (its parts' streams)
        stream = None if self.options.route_by_stream_id else self.options.stream_id
        with pooled(self.options.settings) as client:
            result = client.commit(identity, batch_id, stream, _receipts(messages))
        if repeated is None:
            return
        staged = sum(int(r.get("count", 0)) for r in _receipts(messages))
        if "count" in result and int(result["count"]) != staged:
            log.warning(
                "aeron sink %s: batch %d was already committed earlier with %s rows; the %d rows "
                "staged now were not appended (%s)",
                self.options.sink_id,
                batch_id,
                result["count"],
                staged,
                repeated,
            )
        log.info("aeron sink %s: batch %d committed: %s", self.options.sink_id, batch_id, result)

    def abort(self, identity: str, batch_id: int, messages: list) -> None:
        with pooled(self.options.settings) as client:
            client.abort(identity, batch_id, _receipts(messages))

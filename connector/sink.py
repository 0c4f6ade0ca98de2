"""The ``aeron`` sink: exactly-once appends through the stream server's stage/commit protocol.

Each task stages its rows on the server under (sinkId, batch id, partition id, attempt) and
returns the staging receipt as its commit message; the driver's ``commit`` asks the server to
append every named part, in partition order, once per (sinkId, batch id). A retried or
speculative task stages under another attempt that no commit names (garbage-collected by lease),
and a batch committed twice after a restart is appended once: the server's commit is idempotent.

The streaming batch id reaches the executor through the task-local property
``streaming.sql.batchId`` that Spark's micro-batch engine sets. A batch write (``df.write``) uses
its ``batchId`` option when given (with ``sinkId``: the idempotence key of a write repeated when
Spark replays a ``foreachBatch`` batch, as Delta's ``txnAppId`` + ``txnVersion``), else an id
drawn once on the driver for that write job.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from aeron_spark.connector.client import StreamClient, pooled
from aeron_spark.connector.formats import payload_run_from_batch, payloads_from_batch
from aeron_spark.connector.formats_arrow import encode_batches
from aeron_spark.connector.formats_records import RECORD_FORMATS, encode_rows
from aeron_spark.connector.formats_sbe import SbeOptions, encode_task
from aeron_spark.connector.formats_sbe import check_sink_schema as check_sbe_schema
from aeron_spark.connector.options import ROUTING_COLUMN, SinkOptions
from aeron_spark.errors import ConfigurationError

log = logging.getLogger("aeron_spark.connector.sink")
ARROW_MESSAGE_BYTES = 128 * 1024  # the largest arrow message; pieces aim at half of it


def _has_binary(t: DataType) -> bool:
    if isinstance(t, BinaryType):
        return True
    if isinstance(t, StructType):
        return any(_has_binary(f.dataType) for f in t.fields)
    if isinstance(t, ArrayType):
        return _has_binary(t.elementType)
    if isinstance(t, MapType):
        return _has_binary(t.keyType) or _has_binary(t.valueType)
    return False


def sink_payloads(
    batch: pa.RecordBatch, fmt: str, compression: str | None = None, sbe: SbeOptions | None = None
) -> tuple[list[bytes], list[int] | None]:
    """The messages of one sink batch in ``fmt`` (and reserved values, binary/text only)."""
    if sbe is not None:
        return encode_task([batch], sbe), None
    if fmt == "arrow":  # whole batches, no Python per row
        return list(encode_batches(batch, ARROW_MESSAGE_BYTES, compression)), None
    if fmt in RECORD_FORMATS:
        return encode_rows(batch, fmt), None
    return payloads_from_batch(batch, fmt)


def check_sink_schema(schema: StructType, fmt: str, sbe: SbeOptions | None = None) -> None:
    """Fail before any task runs when the DataFrame does not fit the format."""
    names = [f.name for f in schema.fields]
    if fmt == "sbe" and sbe is not None:
        from pyspark.sql.pandas.types import to_arrow_schema

        check_sbe_schema(to_arrow_schema(schema, timezone="UTC"), sbe)
        return
    if fmt in ("arrow", *RECORD_FORMATS):
        if not names:
            raise ConfigurationError("schema", "struct<>", f"at least one column for format={fmt}")
        if fmt == "json":
            for f in schema.fields:
                if _has_binary(f.dataType):
                    raise ConfigurationError(
                        f.name,
                        f.dataType.simpleString(),
                        "a column JSON can carry (binary is "
                        "not: base64() it, or use format=msgpack or arrow)",
                    )
        return
    if "value" not in names:
        raise ConfigurationError(
            "value",
            names,
            "a DataFrame with a `value` column "
            f"({'string' if fmt == 'text' else 'binary'}) to write",
        )
    value = schema["value"].dataType
    wanted = StringType() if fmt == "text" else BinaryType()
    if value != wanted:
        raise ConfigurationError(
            "value",
            value.simpleString(),
            f"{wanted.simpleString()} for format={fmt} (cast the column)",
        )
    if "reserved_value" in names and schema["reserved_value"].dataType.simpleString() not in (
        "bigint",
        "int",
    ):
        raise ConfigurationError(
            "reserved_value", schema["reserved_value"].dataType.simpleString(), "bigint or int"
        )


@dataclass
class StagedPart(WriterCommitMessage):
    receipt: dict = field(default_factory=dict)
    routed: list[dict] = field(default_factory=list)  # routing by stream_id: a part per stream


def task_attempt() -> tuple[int, int]:
    """This task's partition id and attempt number ((0, 0) outside a Spark task)."""
    ctx = TaskContext.get()
    return (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)


def streaming_batch_id() -> int:
    """The micro-batch id of the streaming write this task is part of."""
    ctx = TaskContext.get()
    batch_text = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    if batch_text is None:
        raise RuntimeError(
            "the streaming batch id is not set on this task "
            "(property streaming.sql.batchId); cannot stage exactly once"
        )
    return int(batch_text)


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


def _stage(
    options: SinkOptions, sink_id: str, batch_id: int, iterator: Iterator[pa.RecordBatch]
) -> StagedPart:
    partition_id, attempt = task_attempt()
    key = (sink_id, batch_id, partition_id, attempt)

    # A pooled session: Python workers are reused across tasks and micro-batches, so the
    # handshake and the session's buffers are paid once per worker, not once per task.
    with pooled(options.settings) as client:
        if not options.route_by_stream_id:
            return StagedPart(_stage_part(client, options, key, options.stream_id, iterator))
        # one part per stream, staged one after another: the task's rows are held (as Arrow)
        # until all of them are routed
        groups = route_by_stream_id(iterator)
        receipts = [
            _stage_part(client, options, key, stream_id, iter(groups[stream_id]))
            for stream_id in sorted(groups)
        ]
    return StagedPart(routed=receipts)


def _receipts(messages: list) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if isinstance(m, StagedPart):
            out += ([m.receipt] if m.receipt else []) + m.routed
    return out


def _commit_stream(options: SinkOptions) -> int | None:
    """The stream a commit names: the sink's, or None for a routing sink (its parts' streams)."""
    return None if options.route_by_stream_id else options.stream_id


def _warn_if_committed_before(
    result: dict, messages: list, sink_id: str | None, batch_id: int, why: str
) -> None:
    staged = sum(int(r.get("count", 0)) for r in _receipts(messages))
    if "count" in result and int(result["count"]) != staged:
        log.warning(
            "aeron sink %s: batch %d was already committed earlier with %s rows; the %d rows "
            "staged now were not appended (%s)",
            sink_id,
            batch_id,
            result["count"],
            staged,
            why,
        )


def warn_stream_id_column_ignored(stream_id: int) -> None:
    """The driver's word that a ``stream_id`` column routes nothing: ``streamId`` was given."""
    log.warning(
        "aeron sink: every row goes to streamId=%d; the DataFrame's %s column does not route "
        "rows when streamId is given (leave streamId out to route each row to its %s)",
        stream_id,
        ROUTING_COLUMN,
        ROUTING_COLUMN,
    )


def refuse_batch_id(options: SinkOptions, what: str) -> None:
    """``batchId`` names a batch write's batch; ``what`` (a streaming or raw sink) has none."""
    if options.batch_id is not None:
        raise ConfigurationError("batchId", options.batch_id, f"no batchId for {what}")


class AeronStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        refuse_batch_id(options, "a streaming write (Spark gives each micro-batch its id)")
        if not options.sink_id:
            raise ConfigurationError(
                "sinkId",
                None,
                "a stable sink identity for exactly-once "
                "streaming writes (keep it across query restarts)",
            )
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPart:
        return _stage(
            self.options, str(self.options.commit_identity), streaming_batch_id(), iterator
        )

    def commit(self, messages: list, batchId: int) -> None:
        with pooled(self.options.settings) as client:
            result = client.commit(
                str(self.options.commit_identity),
                batchId,
                _commit_stream(self.options),
                _receipts(messages),
            )
        # The server already holds a commit of this (sinkId, batch) from an earlier run: the
        # usual cause is a query restarted with a new checkpoint but the same sinkId.
        _warn_if_committed_before(
            result, messages, self.options.sink_id, batchId, "new checkpoint with an old sinkId?"
        )
        log.info("aeron sink %s: batch %d committed: %s", self.options.sink_id, batchId, result)

    def abort(self, messages: list, batchId: int) -> None:
        with pooled(self.options.settings) as client:
            client.abort(str(self.options.commit_identity), batchId, _receipts(messages))


class AeronBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.sink_id = options.sink_id or "batch-write"
        # the caller's idempotence key (foreachBatch's batch id), else one drawn once on the
        # driver and pickled to the tasks: a new batch for every write
        self.batch_id = options.batch_id if options.batch_id is not None else secrets.randbits(62)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPart:
        return _stage(self.options, self.sink_id, self.batch_id, iterator)

    def commit(self, messages: list) -> None:
        with pooled(self.options.settings) as client:
            result = client.commit(
                self.sink_id, self.batch_id, _commit_stream(self.options), _receipts(messages)
            )
        if self.options.batch_id is not None:
            # a replayed foreachBatch batch: the first write's rows are in, these are not
            _warn_if_committed_before(
                result, messages, self.sink_id, self.batch_id, "a repeated (sinkId, batchId)"
            )

    def abort(self, messages: list) -> None:
        with pooled(self.options.settings) as client:
            client.abort(self.sink_id, self.batch_id, _receipts(messages))

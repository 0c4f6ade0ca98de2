"""The ``aeron`` sink: exactly-once appends, written once over the sink-store contract
(:class:`~aeron_spark.connector.stores.SinkStore`: stage, commit, abort).

Each task stages its rows in the store under (identity, batch id, its partition and attempt) and
returns what it staged as its commit message; the driver's ``commit`` appends every named part,
in partition order, once per (identity, batch id), and ``abort`` drops them. The stream server
(:mod:`.stores.server.sink`: its stage/commit protocol) and an Aeron Archive
(:mod:`.stores.archive.sink`: staging recordings, a target recording with BEGIN/END markers) are
the two stores.

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

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from aeron_spark.connector.formats_records import RECORD_FORMATS
from aeron_spark.connector.formats_sbe import SbeOptions
from aeron_spark.connector.formats_sbe import check_sink_schema as check_sbe_schema
from aeron_spark.connector.options import ROUTING_COLUMN, ArchiveSinkOptions, SinkOptions
from aeron_spark.connector.stores import SinkStore
from aeron_spark.connector.stores.archive.sink import ArchiveSink
from aeron_spark.connector.stores.server.sink import ServerSink, StagedPart, route_by_stream_id
from aeron_spark.connector.stores.tasks import (
    ARROW_MESSAGE_BYTES,
    sink_payloads,
    streaming_batch_id,
    task_attempt,
)
from aeron_spark.errors import ConfigurationError

log = logging.getLogger("aeron_spark.connector.sink")

__all__ = [
    "ARROW_MESSAGE_BYTES",
    "AeronBatchWriter",
    "AeronStreamWriter",
    "StagedPart",
    "check_sink_schema",
    "refuse_batch_id",
    "route_by_stream_id",
    "sink_payloads",
    "sink_store_of",
    "streaming_batch_id",
    "task_attempt",
]


def sink_store_of(options: SinkOptions | ArchiveSinkOptions) -> tuple[SinkOptions, SinkStore]:
    """The sink options and the store they name (the stream server, or ``archive``'s)."""
    if isinstance(options, ArchiveSinkOptions):
        return options.sink, ArchiveSink(options)
    return options, ServerSink(options)


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
    """A streaming write: Spark's micro-batch id is the batch; ``sinkId`` (scoped to the
    query's checkpoint) the identity."""

    def __init__(
        self, options: SinkOptions | ArchiveSinkOptions, store: SinkStore | None = None
    ) -> None:
        self.options, default = sink_store_of(options)
        self.store = store or default
        refuse_batch_id(self.options, "a streaming write (Spark gives each micro-batch its id)")
        if not self.options.sink_id:
            into = " into the archive" if self.store.name == "archive" else ""
            raise ConfigurationError(
                "sinkId",
                None,
                f"a stable sink identity for exactly-once streaming writes{into} (keep it across "
                "query restarts)",
            )
        self.identity = str(self.options.commit_identity)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.store.stage(self.identity, streaming_batch_id(), iterator)

    def commit(self, messages: list, batchId: int) -> None:
        # The store may already hold a commit of this (sinkId, batch) from an earlier run: the
        # usual cause is a query restarted with a new checkpoint but the same sinkId.
        self.store.commit(self.identity, batchId, messages, "new checkpoint with an old sinkId?")

    def abort(self, messages: list, batchId: int) -> None:
        self.store.abort(self.identity, batchId, messages)


class AeronBatchWriter(DataSourceArrowWriter):
    """A batch write: ``batchId`` (with ``sinkId``) is the caller's idempotence key, else a
    batch drawn once on the driver (pickled to the tasks: a new batch for every write)."""

    def __init__(
        self, options: SinkOptions | ArchiveSinkOptions, store: SinkStore | None = None
    ) -> None:
        self.options, default = sink_store_of(options)
        self.store = store or default
        self.sink_id = self.options.sink_id or "batch-write"
        given = self.options.batch_id
        self.batch_id = given if given is not None else secrets.randbits(62)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.store.stage(self.sink_id, self.batch_id, iterator)

    def commit(self, messages: list) -> None:
        # a replayed foreachBatch batch: the first write's rows are in, these are not
        repeated = None if self.options.batch_id is None else "a repeated (sinkId, batchId)"
        self.store.commit(self.sink_id, self.batch_id, messages, repeated)

    def abort(self, messages: list) -> None:
        self.store.abort(self.sink_id, self.batch_id, messages)

"""The data source ``aeron``: ``spark.read``/``readStream``/``write``/``writeStream``
``.format("aeron")``.

Registered automatically through the ``pyspark_aeron`` module once the package is installed;
``spark.dataSource.register(AeronDataSource)`` works too.

Example::

    df = (spark.readStream.format("aeron")
          .option("endpoint", "127.0.0.1:40123").option("streamId", 10).load())
    (df.select("value").writeStream.format("aeron")
       .option("endpoint", "127.0.0.1:40123").option("streamId", 20).option("sinkId", "copy")
       .option("checkpointLocation", "/tmp/ckpt").start())
"""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from aeron_spark.errors import ConfigurationError

if TYPE_CHECKING:
    from aeron_spark.connector.options import (
        ArchiveSinkOptions,
        ArchiveSourceOptions,
        SinkOptions,
        SourceOptions,
    )

# Spark's Python worker imports this module for every read and write task (the task's function
# holds the data source), so it imports what planning needs only when planning asks (issue 31
# item 2: each module it loads is walked by the gc.collect() a reused worker runs after every
# task); the reader's and writer's own modules come with their pickled instances.


class AeronDataSource(DataSource):
    """Streams recorded by an aeron-spark stream server, as rows; and an exactly-once sink."""

    @classmethod
    def name(cls) -> str:
        return "aeron"

    def schema(self) -> str | StructType:
        from aeron_spark.connector.source import source_schema

        return source_schema(_source_options(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        from aeron_spark.connector.options import SourceOptions
        from aeron_spark.connector.source import AeronBatchReader, AeronFilteringBatchReader

        options = _source_options(self.options)
        if not isinstance(options, SourceOptions):
            return AeronBatchReader(options, schema)  # no filter pushdown into an archive
        if options.read_on == "driver":
            raise ConfigurationError(
                "readOn",
                "driver",
                "executors for a batch read (readOn=driver is for streaming queries)",
            )
        if _filter_pushdown_on():
            return AeronFilteringBatchReader(options, schema)
        return AeronBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from aeron_spark.connector.options import SourceOptions
        from aeron_spark.connector.source import AeronStreamReader

        options = _source_options(self.options)
        if isinstance(options, SourceOptions) and options.read_on == "driver":
            # Spark's documented fallback: a source whose streamReader() is not implemented is
            # read through simpleStreamReader(), on Spark's prefetching path.
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return AeronStreamReader(options, schema)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        from aeron_spark.connector.options import parse_source_options
        from aeron_spark.connector.source import AeronDriverStreamReader

        return AeronDriverStreamReader(parse_source_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from aeron_spark.connector.options import is_archive_mode
        from aeron_spark.connector.raw import RawBatchWriter
        from aeron_spark.connector.sink import AeronBatchWriter, refuse_batch_id

        if is_archive_mode(self.options):
            archive = _archive_sink_options(self.options, schema)
            if overwrite:
                raise ConfigurationError(
                    "mode", "overwrite", "append (a recording cannot be overwritten)"
                )
            return AeronBatchWriter(archive)
        options, schema = _sink_options(self.options, schema)
        if overwrite:
            raise ConfigurationError("mode", "overwrite", "append (a stream cannot be overwritten)")
        if options.channel is not None:
            refuse_batch_id(options, "raw mode (channel: at-least-once, nothing is committed)")
            return RawBatchWriter(options)
        return AeronBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from aeron_spark.connector.options import is_archive_mode
        from aeron_spark.connector.raw import RawStreamWriter
        from aeron_spark.connector.sink import AeronStreamWriter, refuse_batch_id

        if is_archive_mode(self.options):
            return AeronStreamWriter(_archive_sink_options(self.options, schema))
        options, schema = _sink_options(self.options, schema)
        if options.channel is not None:
            refuse_batch_id(options, "raw mode (channel: at-least-once, nothing is committed)")
            return RawStreamWriter(options)
        return AeronStreamWriter(options)


def _source_options(options: Mapping[str, str]) -> SourceOptions | ArchiveSourceOptions:
    from aeron_spark.connector.options import (
        is_archive_mode,
        parse_archive_source_options,
        parse_source_options,
    )

    if is_archive_mode(options):
        return parse_archive_source_options(options)
    return parse_source_options(options)


def _archive_sink_options(options: Mapping[str, str], schema: StructType) -> ArchiveSinkOptions:
    """The archive sink's options, checked against the DataFrame's schema: it appends to one
    target recording, so a ``stream_id`` column does not route (``streamId`` is required)."""
    from aeron_spark.connector.options import ROUTING_COLUMN, parse_archive_sink_options
    from aeron_spark.connector.sink import check_sink_schema, warn_stream_id_column_ignored

    has_column = ROUTING_COLUMN in schema.fieldNames()
    if has_column and not any(str(k).lower() in ("streamid", "streamids") for k in options):
        raise ConfigurationError(
            "streamId",
            None,
            f"a stream id with archive: the archive sink appends to one target recording "
            f"of streamId and does not route rows by a {ROUTING_COLUMN} column",
        )
    o = parse_archive_sink_options(dict(options))
    if has_column:
        warn_stream_id_column_ignored(o.sink.stream_id)
    check_sink_schema(schema, o.sink.format, o.sink.sbe)
    return o


def _sink_options(options: Mapping[str, str], schema: StructType) -> tuple[SinkOptions, StructType]:
    """The sink's options, checked against the DataFrame's schema. A ``stream_id`` column routes
    each row to its stream when no ``streamId`` is given, and is then no part of the messages
    (the schema the messages get is returned); beside ``streamId`` it is ignored, with a warning
    (``streamId`` wins, as Kafka's ``topic`` option over a ``topic`` column)."""
    from aeron_spark.connector.options import ROUTING_COLUMN, parse_sink_options
    from aeron_spark.connector.sink import check_sink_schema, warn_stream_id_column_ignored

    has_column = ROUTING_COLUMN in schema.fieldNames()
    parsed = parse_sink_options(options, routed=has_column)
    if parsed.route_by_stream_id:
        column = schema[ROUTING_COLUMN].dataType.simpleString()
        if column not in ("int", "bigint", "smallint", "tinyint"):
            raise ConfigurationError(ROUTING_COLUMN, column, "an integer column (the stream id)")
        schema = StructType([f for f in schema.fields if f.name != ROUTING_COLUMN])
    elif has_column:
        warn_stream_id_column_ignored(parsed.stream_id)
    check_sink_schema(schema, parsed.format, parsed.sbe)
    return parsed, schema


def _filter_pushdown_on() -> bool:
    """Whether Spark plans this read with ``spark.sql.python.filterPushdown.enabled``.

    PySpark 4.3 fails a batch read whose reader implements ``pushFilters`` while the setting is
    off, and tells the data source nothing about it; the planning worker that asks for the
    reader holds it in a local (``enable_pushdown``), and pushdown itself runs in its own
    worker (``data_source_pushdown_filters``). Anywhere else: no pushdown (the plain reader)."""
    frame = sys._getframe(1)
    while frame is not None:
        where = frame.f_code.co_filename
        if where.endswith("data_source_pushdown_filters.py"):
            return True
        if where.endswith("plan_data_source_read.py") and "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back  # type: ignore[assignment]
    return False


def ensure_registered(spark) -> None:  # type: ignore[no-untyped-def]
    """Register ``aeron`` on ``spark`` unless Spark's own discovery will find it.

    A regular install is found by Spark (it imports installed ``pyspark_*`` modules); an editable
    install (``pip install -e``) is invisible to that ``pkgutil``-based lookup, so register it.
    """
    if not any(m.name == "pyspark_aeron" for m in pkgutil.iter_modules()):
        spark.dataSource.register(AeronDataSource)

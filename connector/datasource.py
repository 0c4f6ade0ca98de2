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

from aeron_spark.connector import archive_sink, archive_source
from aeron_spark.connector.archive_options import is_archive_mode
from aeron_spark.connector.options import (
    ROUTING_COLUMN,
    SinkOptions,
    parse_sink_options,
    parse_source_options,
)
from aeron_spark.connector.raw import RawBatchWriter, RawStreamWriter
from aeron_spark.connector.sink import (
    AeronBatchWriter,
    AeronStreamWriter,
    check_sink_schema,
    refuse_batch_id,
    warn_stream_id_column_ignored,
)
from aeron_spark.connector.source import (
    AeronBatchReader,
    AeronDriverStreamReader,
    AeronFilteringBatchReader,
    AeronStreamReader,
    source_schema,
)
from aeron_spark.errors import ConfigurationError


class AeronDataSource(DataSource):
    """Streams recorded by an aeron-spark stream server, as rows; and an exactly-once sink."""

    @classmethod
    def name(cls) -> str:
        return "aeron"

    def schema(self) -> str | StructType:
        if is_archive_mode(self.options):
            return archive_source.schema(self.options)
        return source_schema(parse_source_options(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        if is_archive_mode(self.options):
            return archive_source.batch_reader(self.options, schema)
        options = parse_source_options(self.options)
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
        if is_archive_mode(self.options):
            return archive_source.stream_reader(self.options, schema)
        options = parse_source_options(self.options)
        if options.read_on == "driver":
            # Spark's documented fallback: a source whose streamReader() is not implemented is
            # read through simpleStreamReader(), on Spark's prefetching path.
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return AeronStreamReader(options, schema)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return AeronDriverStreamReader(parse_source_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if is_archive_mode(self.options):
            return archive_sink.batch_writer(dict(self.options), schema, overwrite)
        options, schema = _sink_options(self.options, schema)
        if overwrite:
            raise ConfigurationError("mode", "overwrite", "append (a stream cannot be overwritten)")
        if options.channel is not None:
            refuse_batch_id(options, "raw mode (channel: at-least-once, nothing is committed)")
            return RawBatchWriter(options)
        return AeronBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if is_archive_mode(self.options):
            return archive_sink.stream_writer(dict(self.options), schema)
        options, schema = _sink_options(self.options, schema)
        if options.channel is not None:
            refuse_batch_id(options, "raw mode (channel: at-least-once, nothing is committed)")
            return RawStreamWriter(options)
        return AeronStreamWriter(options)


def _sink_options(options: Mapping[str, str], schema: StructType) -> tuple[SinkOptions, StructType]:
    """The sink's options, checked against the DataFrame's schema. A ``stream_id`` column routes
    each row to its stream when no ``streamId`` is given, and is then no part of the messages
    (the schema the messages get is returned); beside ``streamId`` it is ignored, with a warning
    (``streamId`` wins, as Kafka's ``topic`` option over a ``topic`` column)."""
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

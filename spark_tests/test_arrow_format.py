"""format=arrow: the sink writes Arrow batches as IPC messages, the source reads them back as
rows."""

from __future__ import annotations

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


def test_arrow_round_trip_batch_and_streaming(spark, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(20_000).selectExpr(
        "id",
        "cast(id * 1.5 as double) as price",
        "concat('sym-', id % 7) as symbol",
        "timestamp_seconds(1700000000 + id) as at",
    )
    (
        df.write.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 70)
        .option("format", "arrow")
        .mode("append")
        .save()
    )
    back = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 70)
        .option("format", "arrow")
        .load()
    )
    assert back.schema.simpleString() == "struct<id:bigint,price:double,symbol:string,at:timestamp>"
    assert_df_equality(back, df, ignore_row_order=True, ignore_nullable=True)
    query = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 70)
        .option("format", "arrow")
        .option("schema", "id long, price double, symbol string, at timestamp")
        .load()
        .where("symbol = 'sym-3'")
        .writeStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 71)
        .option("format", "arrow")
        .option("sinkId", "arrow-copy")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300) and query.exception() is None
    copied = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 71)
        .option("format", "arrow")
        .load()
    )
    assert_df_equality(
        copied, df.where("symbol = 'sym-3'"), ignore_row_order=True, ignore_nullable=True
    )


def test_arrow_errors_name_the_problem(spark, server) -> None:  # type: ignore[no-untyped-def]
    with raises_project(ConfigurationError, "schema"):  # nothing to infer from
        spark.read.format("aeron").option("endpoint", server.endpoint).option(
            "streamId", 72
        ).option("format", "arrow").load().collect()
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(73, [b"not arrow at all"])
    with raises_project(ControlProtocolError, "not an Arrow IPC stream"):
        spark.read.format("aeron").option("endpoint", server.endpoint).option(
            "streamId", 73
        ).option("format", "arrow").load().collect()
    table = pa.table({"x": pa.array(["a", "b"])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(74, [sink.getvalue().to_pybytes()])
    with raises_project(ControlProtocolError, "does not fit the query's schema"):
        spark.read.format("aeron").option("endpoint", server.endpoint).option(
            "streamId", 74
        ).option("format", "arrow").option("schema", "y long").load().collect()


def test_arrow_compression_round_trips_in_fewer_bytes(spark, server) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(30_000).selectExpr("id", "concat('symbol-', id % 5) as symbol")
    recorded = {}
    for stream, compression in ((75, "none"), (76, "lz4"), (77, "zstd")):
        (
            df.write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", stream)
            .option("format", "arrow")
            .option("compression", compression)
            .mode("append")
            .save()
        )
        back = (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", stream)
            .option("format", "arrow")
            .load()
        )
        assert_df_equality(back, df, ignore_row_order=True, ignore_nullable=True)
        with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
            recorded[compression] = sum(
                r.recorded_position for r in client.list_recordings(stream_ids=[stream])
            )
    assert recorded["lz4"] < recorded["none"] / 2 and recorded["zstd"] < recorded["none"] / 2
    with raises_project(ConfigurationError, "compression"):
        (
            spark.range(3)
            .selectExpr("cast(cast(id as string) as binary) as value")
            .write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 78)
            .option("compression", "lz4")
            .mode("append")
            .save()
        )

"""format=json / msgpack / text through Spark: sink and source round trips, bad-record policies."""

from __future__ import annotations

import msgpack
import pytest
from chispa import assert_df_equality

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.formats_records import BadRecordError
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark

DDL = "id long, price double, symbol string, at timestamp, day date"


def frame(spark):  # type: ignore[no-untyped-def]
    return spark.range(3000).selectExpr(
        "id",
        "cast(id * 1.5 as double) as price",
        "concat('sym-', id % 7) as symbol",
        "timestamp_seconds(1700000000 + id) as at",
        "date_add(date'2026-01-01', cast(id % 40 as int)) as day",
    )


def read(spark, server, stream: int, fmt: str, **options: str):  # type: ignore[no-untyped-def]
    reader = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", stream)
        .option("format", fmt)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.parametrize(("fmt", "stream"), [("json", 80), ("msgpack", 81)])
def test_record_format_round_trip(spark, server, tmp_path, fmt: str, stream: int) -> None:  # type: ignore[no-untyped-def]
    df = frame(spark)
    (
        df.write.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", stream)
        .option("format", fmt)
        .mode("append")
        .save()
    )
    back = read(spark, server, stream, fmt, schema=DDL)
    assert_df_equality(back, df, ignore_row_order=True, ignore_nullable=True)
    inferred = read(spark, server, stream, fmt)  # schema of the first message
    assert set(inferred.columns) == {"id", "price", "symbol", "at", "day"}
    assert inferred.count() == 3000
    # streaming, with the metadata columns: positions increase per recording, one row a message
    query = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", stream)
        .option("format", fmt)
        .option("schema", DDL)
        .option("includeMetadata", "true")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300) and query.exception() is None
    out = spark.read.parquet(str(tmp_path / "out"))
    assert out.columns[:5] == ["id", "price", "symbol", "at", "day"]
    assert "position" in out.columns and "recording_id" in out.columns
    assert_df_equality(out.select(*df.columns), df, ignore_row_order=True, ignore_nullable=True)
    assert out.select("position").distinct().count() == 3000


def test_bad_records_fail_drop_or_column(spark, server) -> None:  # type: ignore[no-untyped-def]
    messages = [msgpack.packb({"id": i, "symbol": f"s{i}"}) for i in range(100)]
    messages[10] = b"\xc1 not msgpack"
    messages[50] = msgpack.packb([1, 2, 3])
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(82, messages)
    ddl = "id long, symbol string"
    with raises_project(BadRecordError, "is not a msgpack map.*badRecordsPolicy"):
        read(spark, server, 82, "msgpack", schema=ddl).collect()
    dropped = read(spark, server, 82, "msgpack", schema=ddl, badRecordsPolicy="drop")
    assert sorted(r.id for r in dropped.collect()) == [i for i in range(100) if i not in (10, 50)]
    kept = read(
        spark,
        server,
        82,
        "msgpack",
        schema=ddl,
        badRecordsPolicy="column",
        corruptRecordColumn="bad",
    ).orderBy("id")
    rows = (
        read(
            spark,
            server,
            82,
            "msgpack",
            schema=ddl,
            badRecordsPolicy="column",
            corruptRecordColumn="bad",
            includeMetadata="true",
        )
        .orderBy("position")
        .collect()
    )
    assert kept.columns == ["id", "symbol", "bad"]
    assert len(rows) == 100
    assert [bytes(r.bad) for r in rows if r.bad is not None] == [messages[10], messages[50]]
    assert rows[10].id is None and rows[11].id == 11


def test_text_bad_utf8(spark, server) -> None:  # type: ignore[no-untyped-def]
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(83, [b"one", b"\xff\xfe", b"three"])
    with raises_project(BadRecordError, "not UTF-8 text"):
        read(spark, server, 83, "text").collect()
    assert [
        r.value
        for r in read(spark, server, 83, "text", badRecordsPolicy="drop")
        .orderBy("position")
        .collect()
    ] == ["one", "three"]
    rows = read(spark, server, 83, "text", badRecordsPolicy="column").orderBy("position").collect()
    assert [r.value for r in rows] == ["one", None, "three"]
    assert rows[1]._corrupt_record == bytearray(b"\xff\xfe")


def test_record_format_errors_name_the_option_or_column(spark, server) -> None:  # type: ignore[no-untyped-def]
    with raises_project(ConfigurationError, "badRecordsPolicy"):
        read(spark, server, 80, "json", badRecordsPolicy="ignore").collect()
    with raises_project(ConfigurationError, "includeMetadata"):
        read(spark, server, 80, "binary", includeMetadata="true").collect()
    with raises_project(ConfigurationError, "schema"):
        read(spark, server, 84, "json").collect()  # empty stream: nothing to infer from
    df = spark.range(3).selectExpr("id", "cast(id as string) as s", "cast('x' as binary) as blob")
    with raises_project(ConfigurationError, "blob"):
        (
            df.write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 85)
            .option("format", "json")
            .mode("append")
            .save()
        )

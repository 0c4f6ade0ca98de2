"""format=sbe through Spark: SBE messages as typed columns and rows as SBE messages, round trips
through a stream server, other templates (fail / skip), sink errors before anything is staged."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from aeron_spark.connector.formats_sbe import OtherTemplateRecordError
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.sbe.errors import SbeEncodeError
from spark_tests._errors import raises_project

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import sbe_values as sv  # noqa: E402

from aeron_spark.connector.client import ClientSettings, StreamClient  # noqa: E402
from aeron_spark.transport import sbe  # noqa: E402

pytestmark = pytest.mark.spark

V1 = str(sv.DATA / "golden-v1.xml")


def read(spark, server, stream: int, **options: str):  # type: ignore[no-untyped-def]
    reader = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", stream)
        .option("format", "sbe")
        .option("sbeSchema", V1)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def write(df, server, stream: int, **options: str) -> None:  # type: ignore[no-untyped-def]
    writer = (
        df.write.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", stream)
        .option("format", "sbe")
        .option("sbeSchema", V1)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def rows_of(df, order: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [sv.normal(r.asDict(recursive=True)) for r in df.orderBy(order).collect()]


def published(server, stream: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        out = []
        for rec in client.list_recordings(stream_ids=[stream]):
            from aeron_spark.connector.formats import Geometry, iter_messages

            blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            geometry = Geometry(rec.initial_term_id, rec.term_length)
            out += [bytes(m.payload) for m in iter_messages(blocks, geometry)]
        return out


def test_fixed_messages_read_and_written(spark, server) -> None:  # type: ignore[no-untyped-def]
    codec = sbe.load(V1, "Tick")
    rows = sv.random_rows(codec.message, 3000, seed=11)
    for i, r in enumerate(rows):
        r["seq"] = i  # a key to order by
    payloads = codec.encode(pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema))
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(90, payloads)
    df = read(spark, server, 90, sbeMessage="Tick")
    assert df.schema.simpleString().startswith(
        "struct<seq:decimal(20,0),at:bigint,price:struct<mantissa:bigint,exponent:tinyint>"
    )
    assert rows_of(df, "seq") == rows
    # Spark rows back into SBE messages: the same bytes
    write(df, server, 91, sbeMessage="1")
    assert sorted(published(server, 91)) == sorted(payloads)
    # with the metadata columns
    meta = (
        read(spark, server, 90, sbeMessage="Tick", includeMetadata="true")
        .orderBy("position")
        .collect()
    )
    assert [int(r.seq) for r in meta] == list(range(3000))
    assert len({r.position for r in meta}) == 3000 and meta[0].stream_id == 90


def test_groups_and_var_data_round_trip(spark, server) -> None:  # type: ignore[no-untyped-def]
    codec = sbe.load(V1, "Order")
    rows = sv.random_rows(codec.message, 500, seed=12)
    for i, r in enumerate(rows):
        r["orderId"] = i
    table = pa.Table.from_pylist(rows, schema=codec.arrow_schema)
    df = spark.createDataFrame(table)
    write(df, server, 92, sbeMessage="Order")
    back = read(spark, server, 92, sbeMessage="Order")
    assert rows_of(back, "orderId") == rows
    decoded, _ = codec.decode(published(server, 92))
    assert sorted(sv.normal(decoded.to_pylist()), key=lambda r: r["orderId"]) == rows


def test_a_venue_schema_with_includes_round_trips(spark, server) -> None:  # type: ignore[no-untyped-def]
    """Issue 33: a schema whose common types come through <xi:include> (the executors get it
    resolved), sets over named types, char enums with digit values, required enums holding null."""
    venue = str(sv.DATA / "golden-venue.xml")
    codec = sbe.load(venue, "Exec")
    rows = sv.random_rows(codec.message, 300, seed=15)
    for i, r in enumerate(rows):
        r["seq"] = i
    rows[0]["side"], rows[0]["aggressor"] = None, None  # Java's NULL_VAL in required enums
    df = spark.createDataFrame(pa.Table.from_pylist(rows, schema=codec.arrow_schema))
    write(df, server, 98, sbeSchema=venue, sbeMessage="Exec")
    assert rows_of(read(spark, server, 98, sbeSchema=venue), "seq") == rows
    raw = read(spark, server, 98, sbeSchema=venue, sbeEnums="raw")
    sides = [r.side for r in raw.orderBy("seq").collect()]
    assert sides[0] is None
    assert set(sides[1:]) <= {None, ord("1"), ord("2")}  # the characters '1' and '2'
    write(raw, server, 99, sbeSchema=venue, sbeEnums="raw")
    assert sorted(published(server, 99)) == sorted(published(server, 98))  # as read, bytes too


def test_other_templates_fail_or_skip(spark, server) -> None:  # type: ignore[no-untyped-def]
    tick, order = sbe.load(V1, "Tick"), sbe.load(V1, "Order")
    ticks = tick.encode(
        pa.RecordBatch.from_pylist(sv.random_rows(tick.message, 20, 1), schema=tick.arrow_schema)
    )
    orders = order.encode(
        pa.RecordBatch.from_pylist(sv.random_rows(order.message, 5, 2), schema=order.arrow_schema)
    )
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(93, ticks[:10] + orders + ticks[10:])
    with raises_project(
        OtherTemplateRecordError,
        r"position \d+ of recording \d+ is template 2 "
        r"of schema 901, not Tick \(1\).*sbeOtherTemplates=skip",
    ):
        read(spark, server, 93, sbeMessage="Tick").collect()
    assert read(spark, server, 93, sbeMessage="Tick", sbeOtherTemplates="skip").count() == 20
    assert read(spark, server, 93, sbeMessage="Order", sbeOtherTemplates="skip").count() == 5


def test_sink_errors_name_column_and_row_before_staging(spark, server) -> None:  # type: ignore[no-untyped-def]
    codec = sbe.load(V1, "Tick")
    rows = sv.random_rows(codec.message, 50, seed=13)
    rows[37]["u8"] = 300  # does not fit uint8 (max 254)
    df = spark.createDataFrame(pa.Table.from_pylist(rows, schema=codec.arrow_schema)).coalesce(1)
    with raises_project(
        SbeEncodeError,
        r"column 'u8', row 37 of this task: expected an integer "
        r"from 0 to 254",
    ):
        write(df, server, 94, sbeMessage="Tick")
    assert published(server, 94) == []  # nothing was appended
    # columns that cannot be the message fail on the driver, before any task
    with raises_project(ConfigurationError, "nope"):
        write(df.withColumn("nope", df.qty), server, 94, sbeMessage="Tick")
    with raises_project(ConfigurationError, "qty"):
        write(df.drop("qty"), server, 94, sbeMessage="Tick")
    with raises_project(ConfigurationError, "an integer column, not string"):
        write(df.withColumn("qty", df.symbol), server, 94, sbeMessage="Tick")


def test_option_errors(spark, server) -> None:  # type: ignore[no-untyped-def]
    with raises_project(ConfigurationError, "sbeMessage.*Tick \\(1\\), Order \\(2\\)"):
        read(spark, server, 95).collect()
    with raises_project(ConfigurationError, "sbeMessage='Nope'"):
        read(spark, server, 95, sbeMessage="Nope").collect()
    with raises_project(ConfigurationError, "sbeSchema"):
        (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 95)
            .option("format", "sbe")
            .load()
            .collect()
        )
    with raises_project(ConfigurationError, "sbeOtherTemplates"):
        read(spark, server, 95, sbeMessage="Tick", sbeOtherTemplates="ignore").collect()
    with raises_project(ConfigurationError, "sbeSchema"):
        (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 95)
            .option("format", "json")
            .option("sbeSchema", V1)
            .load()
            .collect()
        )


def test_streaming_sbe_to_sbe(spark, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """readStream format=sbe into writeStream format=sbe (exactly once through the sink)."""
    codec = sbe.load(V1, "Order")
    rows = sv.random_rows(codec.message, 200, seed=14)
    payloads = codec.encode(pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema))
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(96, payloads)
    query = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 96)
        .option("format", "sbe")
        .option("sbeSchema", V1)
        .option("sbeMessage", "Order")
        .option("maxMessagesPerTrigger", 70)
        .load()
        .writeStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 97)
        .option("format", "sbe")
        .option("sbeSchema", V1)
        .option("sbeMessage", "Order")
        .option("sinkId", "sbe-stream")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300) and query.exception() is None
    assert published(server, 97) == payloads  # in order: one recording, one task per batch

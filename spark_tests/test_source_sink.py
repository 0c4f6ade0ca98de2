"""The aeron source and sink on local Spark against a real stream server on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


def publish(endpoint: str, stream_id: int, payloads: list[bytes]) -> None:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(stream_id, payloads)


def messages(producer: int, count: int, size: int = 0) -> list[bytes]:
    return [f"p{producer}-{i:06d}-".encode() + bytes([65 + i % 26]) * size for i in range(count)]


def read_stream(spark, endpoint: str, checkpoint: Path, name: str, stream_id: int = 10):  # type: ignore[no-untyped-def]
    df = (
        spark.readStream.format("aeron")
        .option("endpoint", endpoint)
        .option("streamId", stream_id)
        .load()
    )
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "query did not finish"
    assert query.exception() is None
    return spark.sql(f"SELECT * FROM {name}")


def test_streaming_read_every_message_once_in_order_per_recording(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    sent = {
        p: messages(p, 3000, size=p * 700) for p in range(3)
    }  # p2: 1400 B > 1 frame at mtu 1408? no; mtu 8192
    for _p, payloads in sent.items():
        publish(server.endpoint, 10, payloads)
    rows = read_stream(spark, server.endpoint, tmp_path / "ckpt", "all_once").collect()
    assert len(rows) == 9000
    by_recording: dict[int, list] = {}
    for row in rows:
        by_recording.setdefault(row.recording_id, []).append(row)
    assert len(by_recording) == 3
    got = {}
    for _rid, recs in by_recording.items():
        recs.sort(key=lambda r: r.position)
        got[bytes(recs[0].value)[:2]] = [bytes(r.value) for r in recs]
        assert all(r.stream_id == 10 for r in recs)
        assert len({r.session_id for r in recs}) == 1
    assert got == {f"p{p}".encode(): sent[p] for p in range(3)}


def test_restart_from_checkpoint_continues_without_gap_or_duplicate(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "out"

    def run() -> None:
        df = (
            spark.readStream.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 11)
            .load()
        )
        query = (
            df.select("value", "recording_id", "position")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300)
        assert query.exception() is None

    publish(server.endpoint, 11, messages(0, 500))
    run()
    publish(server.endpoint, 11, messages(1, 400))
    publish(server.endpoint, 11, messages(0, 10))  # a new session: a recording that appeared later
    run()
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 910
    assert len({(r.recording_id, r.position) for r in rows}) == 910
    assert sorted(bytes(r.value) for r in rows) == sorted(
        messages(0, 500) + messages(1, 400) + messages(0, 10)
    )


def test_batch_read_of_a_position_range(spark, server):  # type: ignore[no-untyped-def]
    publish(server.endpoint, 12, messages(0, 100))
    full = (
        spark.read.format("aeron").option("endpoint", server.endpoint).option("streamId", 12).load()
    )
    rows = sorted(full.collect(), key=lambda r: r.position)
    assert [bytes(r.value) for r in rows] == messages(0, 100)
    rid = rows[0].recording_id
    start, end = rows[10].position, rows[20].position
    part = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 12)
        .option("startingPositions", f'{{"{rid}": {start}}}')
        .option("endingPositions", f'{{"{rid}": {end}}}')
        .load()
    )
    assert sorted(bytes(r.value) for r in part.collect()) == messages(0, 100)[10:20]


def test_text_format(spark, server):  # type: ignore[no-untyped-def]
    publish(server.endpoint, 13, [b"alpha", b"beta"])
    df = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 13)
        .option("format", "text")
        .load()
    )
    assert_df_equality(
        df.select("value"),
        spark.createDataFrame([("alpha",), ("beta",)], "value string"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_bad_options_fail_at_load_naming_the_option(spark, server):  # type: ignore[no-untyped-def]
    reader = spark.read.format("aeron").option("endpoint", server.endpoint)
    with raises_project(ConfigurationError, "streamId"):
        reader.load().collect()
    with raises_project(ConfigurationError, "startingPositions"):
        reader.option("streamId", 1).option("startingPositions", "yesterday").load().collect()
    with raises_project(ConfigurationError, "colour"):
        reader.option("streamId", 1).option("colour", "blue").load().collect()


def test_batch_write_then_read_back_exactly(spark, server):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame(
        [(f"row-{i}".encode(),) for i in range(1000)], "value binary"
    ).repartition(3)
    (
        df.write.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 20)
        .option("sinkId", "batch-test")
        .mode("append")
        .save()
    )
    back = (
        spark.read.format("aeron").option("endpoint", server.endpoint).option("streamId", 20).load()
    )
    assert sorted(bytes(r.value) for r in back.collect()) == sorted(
        f"row-{i}".encode() for i in range(1000)
    )


def test_sink_schema_that_does_not_fit_fails_naming_the_column(spark, server):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(1,)], "payload int")
    with raises_project(ConfigurationError, "value"):
        (
            df.write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 20)
            .mode("append")
            .save()
        )


def test_streaming_write_exactly_once_into_a_stream(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    publish(server.endpoint, 30, messages(0, 2000))
    src = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 30)
        .load()
    )
    out = src.select(F.concat(F.col("value"), F.lit(b"!")).alias("value"))
    query = (
        out.writeStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 31)
        .option("sinkId", "copy-30-31")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300)
    assert query.exception() is None
    back = (
        spark.read.format("aeron").option("endpoint", server.endpoint).option("streamId", 31).load()
    )
    assert sorted(bytes(r.value) for r in back.collect()) == sorted(
        m + b"!" for m in messages(0, 2000)
    )


def test_options_module_rejects_unknown_names() -> None:
    from aeron_spark.connector.options import parse_source_options

    with pytest.raises(ConfigurationError, match="maxOffsetsPerTrigger"):
        parse_source_options({"streamId": "1", "maxOffsetsPerTrigger": "5"})


def test_same_sink_id_with_a_new_checkpoint_is_a_new_query(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    """Batch ids restart at 0 with a new checkpoint: the rows of the second query are appended too,
    while each query's own batches stay exactly-once (commit identity = sinkId + checkpoint)."""

    def copy(stream_in: int, checkpoint: str) -> None:
        src = (
            spark.readStream.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", stream_in)
            .load()
            .select("value")
        )
        query = (
            src.writeStream.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 41)
            .option("sinkId", "shared-id")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300)
        assert query.exception() is None

    publish(server.endpoint, 40, messages(0, 300))
    publish(server.endpoint, 42, messages(1, 200))
    copy(40, "ck-a")
    copy(42, "ck-b")
    back = (
        spark.read.format("aeron").option("endpoint", server.endpoint).option("streamId", 41).load()
    )
    expected = sorted(messages(0, 300) + messages(1, 200))
    assert sorted(bytes(r.value) for r in back.collect()) == expected


def test_sink_reserved_value_column_goes_into_each_frame(spark, server):  # type: ignore[no-untyped-def]
    df = (
        spark.range(500)
        .selectExpr("cast(concat('r-', id) as binary) as value", "id * 3 as reserved_value")
        .repartition(2)
    )
    (
        df.write.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 21)
        .mode("append")
        .save()
    )
    back = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 21)
        .load()
        .collect()
    )
    assert sorted((bytes(r.value), r.reserved_value) for r in back) == sorted(
        (f"r-{i}".encode(), i * 3) for i in range(500)
    )


def test_consumer_id_commits_positions_for_the_servers_retention(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(90, [f"m{i}".encode() for i in range(300)])
        [info] = client.list_recordings(stream_ids=[90])

    def run() -> None:
        query = (
            spark.readStream.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 90)
            .option("consumerId", "retention-test")
            .option("maxMessagesPerTrigger", 100)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120) and query.exception() is None

    def committed() -> dict:
        with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
            consumers = {c["consumer_id"]: c for c in client.stats()["consumers"]}
        assert consumers["retention-test"]["stream_ids"] == [90]
        return consumers["retention-test"]["positions"]

    run()
    # Spark commits a batch's source offsets when it plans the next one: after three batches of
    # 100 messages (64-byte frames) the server knows the end of the second
    assert committed() == {str(info.recording_id): 200 * 64}
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(90, [b"more"])
    run()  # the restarted query plans a batch for the new message: the first run's end follows
    assert committed() == {str(info.recording_id): info.recorded_position}
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        assert client.consumer_forget("retention-test")

"""``localReads`` / ``localWrites``: tasks that see the server's directory read their ranges from
its segment files and write their staged sink parts there; the rows are the ones a replay or a
stage over the session gives, in batch and streaming queries."""

from __future__ import annotations

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.formats_arrow import encode_batches
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


def _counters(endpoint: str) -> dict[str, int]:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        counters = client.stats()["counters"]
    return {
        k: counters[k]
        for k in (
            "local_reads_offered",
            "replays_started",
            "sink_parts_staged",
            "sink_parts_staged_locally",
        )
    }


def _read(spark, endpoint: str, stream_id: int, local: str, **options: str):  # type: ignore[no-untyped-def]
    reader = (
        spark.read.format("aeron")
        .option("endpoint", endpoint)
        .option("streamId", stream_id)
        .option("localReads", local)
        .option("minPartitions", "3")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_local_and_replayed_reads_give_the_same_rows(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    ep = server.endpoint
    with StreamClient.connect(ClientSettings(endpoint=ep)) as client:
        for part in range(4):  # several appends: several time-index entries per recording
            client.publish(
                40,
                [b"m-%d-%05d" % (part, i) + bytes(i % 300) for i in range(3000)],
                reserved_values=range(3000),
            )
        table = pa.table({"id": list(range(20_000)), "name": [f"n{i}" for i in range(20_000)]})
        client.publish(41, [m for b in table.to_batches(4096) for m in encode_batches(b, 30_000)])

    before = _counters(ep)
    local = _read(spark, ep, 40, "true")
    replayed = _read(spark, ep, 40, "false")
    assert_df_equality(local, replayed, ignore_row_order=True)  # timestamps included
    assert local.count() == 12_000
    middle = _counters(ep)
    assert middle["local_reads_offered"] > before["local_reads_offered"]

    arrow = {"format": "arrow", "schema": "id long, name string"}
    assert_df_equality(
        _read(spark, ep, 41, "true", **arrow),
        _read(spark, ep, 41, "false", **arrow),
        ignore_row_order=True,
    )

    # a streaming query (micro-batches of at most 5,000 messages) reads the same rows
    q = (
        spark.readStream.format("aeron")
        .option("endpoint", ep)
        .option("streamId", 40)
        .option("maxMessagesPerTrigger", "5000")
        .load()
        .writeStream.format("memory")
        .queryName("local_reads_stream")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300) and q.exception() is None
    assert_df_equality(
        spark.sql("SELECT * FROM local_reads_stream"),
        replayed,
        ignore_row_order=True,
        ignore_nullable=True,
    )

    # localReads=false never asks where the files are
    after = _counters(ep)
    _read(spark, ep, 40, "false").count()
    final = _counters(ep)
    assert final["local_reads_offered"] == after["local_reads_offered"]
    assert final["replays_started"] > after["replays_started"]


def test_local_options_are_checked(spark, server):  # type: ignore[no-untyped-def]
    from aeron_spark.connector.options import parse_sink_options, parse_source_options

    assert parse_sink_options({"streamId": "1"}).local_writes
    assert not parse_sink_options({"streamId": "1", "localWrites": "false"}).local_writes
    with pytest.raises(ConfigurationError, match="localWrites"):
        parse_sink_options({"streamId": "1", "localWrites": "perhaps"})

    assert parse_source_options({"streamId": "1"}).local_reads
    assert not parse_source_options({"streamId": "1", "localReads": "false"}).local_reads
    with pytest.raises(ConfigurationError, match="localReads"):
        parse_source_options({"streamId": "1", "localReads": "sometimes"})
    with raises_project(ConfigurationError, "localReads"):
        _read(spark, server.endpoint, 1, "sometimes").collect()


def test_local_and_session_staging_write_the_same_stream(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    ep = server.endpoint
    rows = spark.range(0, 30_000, numPartitions=3).selectExpr(
        "cast(concat('r-', id) as binary) as value", "id as reserved_value"
    )
    before = _counters(ep)
    for stream_id, local in ((50, "true"), (51, "false")):
        (
            rows.write.format("aeron")
            .option("endpoint", ep)
            .option("streamId", stream_id)
            .option("sinkId", f"local-{local}")
            .option("localWrites", local)
            .mode("append")
            .save()
        )
    after = _counters(ep)
    assert after["sink_parts_staged_locally"] - before["sink_parts_staged_locally"] == 3
    assert after["sink_parts_staged"] - before["sink_parts_staged"] == 6

    def back(stream_id: int):  # type: ignore[no-untyped-def]
        return (
            spark.read.format("aeron")
            .option("endpoint", ep)
            .option("streamId", stream_id)
            .load()
            .select("value", "reserved_value")
        )

    assert_df_equality(back(50), back(51), ignore_row_order=True)
    assert back(50).count() == 30_000

    # a streaming query into the sink stages locally and commits each batch once
    q = (
        spark.readStream.format("aeron")
        .option("endpoint", ep)
        .option("streamId", 50)
        .option("maxMessagesPerTrigger", "10000")
        .load()
        .select("value")
        .writeStream.format("aeron")
        .option("endpoint", ep)
        .option("streamId", 52)
        .option("sinkId", "local-stream")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300) and q.exception() is None
    assert_df_equality(back(52).select("value"), back(50).select("value"), ignore_row_order=True)
    assert _counters(ep)["sink_parts_staged_locally"] > after["sink_parts_staged_locally"]

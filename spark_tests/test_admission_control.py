"""Admission control and partitioning of the aeron source: limits per trigger, AvailableNow in
limited batches, minMessagesPerTrigger, minPartitions, message boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.options import parse_source_options
from aeron_spark.connector.source import AeronStreamReader, decode_offset

pytestmark = pytest.mark.spark


def publish(endpoint: str, stream_id: int, payloads: list[bytes], sessions: int = 1) -> None:
    for s in range(sessions):  # one recording per session
        with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
            client.publish(stream_id, payloads[s::sessions])


def _reader(endpoint: str, stream_id: int, **options: str) -> AeronStreamReader:
    return AeronStreamReader(
        parse_source_options({"endpoint": endpoint, "streamId": str(stream_id), **options})
    )


def test_max_messages_per_trigger_with_available_now_reads_everything_in_limited_batches(
    spark, server, tmp_path: Path
) -> None:
    payloads = [b"m%05d" % i for i in range(1000)]
    publish(server.endpoint, 21, payloads, sessions=2)
    df = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 21)
        .option("maxMessagesPerTrigger", 300)
        .load()
    )
    query = (
        df.writeStream.format("memory")
        .queryName("limited")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300) and query.exception() is None
    rows = [bytes(r.value) for r in spark.sql("SELECT value FROM limited").collect()]
    assert sorted(rows) == payloads  # every message exactly once
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 300 and len(sizes) >= 4 and sum(sizes) == 1000


def test_read_limits_on_the_reader_end_on_message_boundaries(server) -> None:
    big = [bytes([i % 256]) * 20_000 for i in range(30)]  # fragmented at any MTU here
    publish(server.endpoint, 22, big)
    reader = _reader(server.endpoint, 22)
    start = reader.initialOffset()
    seen = 0
    offset = start
    while True:
        nxt = reader.latestOffset(offset, ReadMaxRows(7))
        got = sum(
            batch.num_rows for part in reader.partitions(offset, nxt) for batch in reader.read(part)
        )
        if got == 0:
            break
        assert got <= 7
        seen += got
        offset = nxt
    assert seen == 30
    everything = reader.latestOffset(start, ReadAllAvailable())
    by_bytes = reader.latestOffset(start, ReadMaxBytes(50_000))
    (rid,) = decode_offset(everything)
    assert decode_offset(start)[rid] < decode_offset(by_bytes)[rid] < decode_offset(everything)[rid]
    assert reader.reportLatestOffset() == everything


def test_min_messages_per_trigger_waits_for_enough_messages(server) -> None:
    publish(server.endpoint, 23, [b"a"] * 10)
    reader = _reader(server.endpoint, 23, minMessagesPerTrigger="100")
    assert isinstance(reader.getDefaultReadLimit(), ReadMinRows)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMinRows(100)) == start  # 10 < 100: no batch yet
    publish(server.endpoint, 23, [b"b"] * 95)
    assert reader.latestOffset(start, ReadMinRows(100)) != start
    hurried = _reader(server.endpoint, 23, minMessagesPerTrigger="1000", maxTriggerDelayMs="0")
    assert hurried.latestOffset(start, ReadMinRows(1000)) != start  # the delay has passed


def test_min_partitions_splits_at_message_boundaries_and_keeps_every_row(spark, server) -> None:
    payloads = [b"r%05d" % i for i in range(2000)]
    publish(server.endpoint, 24, payloads)
    df = (
        spark.read.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 24)
        .option("minPartitions", 5)
        .load()
    )
    assert df.rdd.getNumPartitions() == 5
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == payloads
    assert df.select("position").distinct().count() == 2000

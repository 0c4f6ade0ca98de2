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
from aeron_spark.connector.source import AeronStreamReader, decode_offset, ranges_of

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


def _recording_bytes(endpoint: str, stream_id: int) -> list[int]:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        recs = client.list_recordings([stream_id])
    return [r.recorded_position - r.start_position for r in recs]


def test_many_small_recordings_are_read_in_few_partitions_every_row_once(spark, server) -> None:
    """Issue 31 item 2: one input partition (one task) a recording made 256 small recordings
    read at 72 k rows/s; now consecutive ranges share a partition up to maxPartitionBytes."""
    payloads = [b"p%05d" % i for i in range(24 * 20)]
    publish(server.endpoint, 26, payloads, sessions=24)  # 24 recordings of 20 messages
    sizes = _recording_bytes(server.endpoint, 26)
    assert len(sizes) == 24 and len(set(sizes)) == 1

    def load(**options: object):  # type: ignore[no-untyped-def]
        reader = spark.read.format("aeron").option("endpoint", server.endpoint)
        for name, value in {"streamId": 26, **options}.items():
            reader = reader.option(name, value)
        return reader.load()

    cases = [
        ({}, 1),  # the default: all of them in one task
        ({"maxPartitionBytes": 6 * sizes[0]}, 4),
        ({"minPartitions": 3}, 3),
        ({"maxPartitionBytes": 1}, 24),  # one recording a partition, as before
    ]
    for options, partitions in cases:
        df = load(**options)
        assert df.rdd.getNumPartitions() == partitions, options
        rows = df.select("recording_id", "position", "value").collect()
        assert sorted(bytes(r.value) for r in rows) == payloads, options  # every row once
        assert len({(r.recording_id, r.position) for r in rows}) == len(payloads)
        assert rows == df.select("recording_id", "position", "value").collect()  # same again


def test_a_micro_batch_over_many_recordings_is_packed_and_its_offsets_are_unchanged(
    server,
) -> None:
    payloads = [b"q%05d" % i for i in range(12 * 10)]
    publish(server.endpoint, 27, payloads, sessions=12)
    packed = _reader(server.endpoint, 27)
    alone = _reader(server.endpoint, 27, maxPartitionBytes="1")
    start = packed.initialOffset()
    end = packed.latestOffset(start, ReadAllAvailable())
    assert end == alone.latestOffset(start, ReadAllAvailable())  # offsets: one a recording
    assert len(decode_offset(end)) == 12
    (task,) = packed.partitions(start, end)
    each = alone.partitions(start, end)
    assert len(each) == 12 and list(ranges_of(task)) == list(each)
    rows = [v for batch in packed.read(task) for v in batch.column("value").to_pylist()]
    assert sorted(rows) == payloads
    assert rows == [v for p in each for b in alone.read(p) for v in b.column("value").to_pylist()]

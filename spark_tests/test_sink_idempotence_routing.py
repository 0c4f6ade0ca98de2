"""Issue 32 items 2 and 3: a batch write's idempotence key (``sinkId`` + ``batchId``) across a
driver killed inside ``foreachBatch``, and rows routed by a ``stream_id`` column.

The kill: a child Python process (its own process group) runs a streaming query whose
``foreachBatch`` writes each micro-batch with ``df.write.format("aeron")``; after the write of
batch 2 is committed on the server, and before Spark records batch 2 as done, the function kills
the child's whole process group (the driver and its JVM) with SIGKILL. The query restarted from
the same checkpoint (in this process's session) replays batch 2: with ``batchId`` its write is
committed once, so every source row is in the target once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

_ROWS = 5000
_PER_TRIGGER = 1000  # five micro-batches
_KILL_AFTER_BATCH = 2
_CHILD_BOUND_S = 300

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pyspark.sql import SparkSession
    from aeron_spark.connector.datasource import ensure_registered

    endpoint, checkpoint, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])  # argv[4]: limit
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ensure_registered(spark)

    def each(df, batch_id):
        (
            df.select("value").write.format("aeron")
            .option("endpoint", endpoint).option("streamId", 61)
            .option("sinkId", "fb-copy").option("batchId", batch_id)
            .mode("append").save()
        )
        if batch_id == kill_after:  # written and committed; Spark has not marked it done
            os.killpg(os.getpgid(0), signal.SIGKILL)

    src = (
        spark.readStream.format("aeron").option("endpoint", endpoint)
        .option("streamId", 60).option("maxMessagesPerTrigger", sys.argv[4]).load()
    )
    query = (
        src.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    sys.exit(3)  # never reached: the kill above ends the process group
    """
)


def _client(endpoint: str) -> StreamClient:
    return StreamClient.connect(ClientSettings(endpoint=endpoint, timeout_s=30.0))


def _publish(endpoint: str, stream_id: int, payloads: list[bytes]) -> None:
    with _client(endpoint) as client:
        for start in range(0, len(payloads), 1000):
            client.publish(stream_id, payloads[start : start + 1000])


def _values(spark, endpoint: str, stream_id: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    df = spark.read.format("aeron").option("endpoint", endpoint).option("streamId", stream_id)
    return sorted(bytes(r.value) for r in df.load().select("value").collect())


def _foreach_batch_copy(spark, endpoint: str, checkpoint: str) -> None:  # type: ignore[no-untyped-def]
    def each(df, batch_id):  # type: ignore[no-untyped-def]
        (
            df.select("value")
            .write.format("aeron")
            .option("endpoint", endpoint)
            .option("streamId", 61)
            .option("sinkId", "fb-copy")
            .option("batchId", batch_id)
            .mode("append")
            .save()
        )

    src = (
        spark.readStream.format("aeron")
        .option("endpoint", endpoint)
        .option("streamId", 60)
        .option("maxMessagesPerTrigger", _PER_TRIGGER)
        .load()
    )
    query = (
        src.writeStream.foreachBatch(each)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(_CHILD_BOUND_S), "the restarted query did not finish in time"
    assert query.exception() is None


def test_foreach_batch_write_killed_mid_batch_and_restarted_writes_every_row_once(  # type: ignore[no-untyped-def]
    spark, server, tmp_path: Path
):
    expected = [f"m-{i:05d}".encode() for i in range(_ROWS)]
    _publish(server.endpoint, 60, expected)
    checkpoint = str(tmp_path / "ckpt")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            server.endpoint,
            checkpoint,
            str(_KILL_AFTER_BATCH),
            str(_PER_TRIGGER),
        ],
        start_new_session=True,  # its own process group: the kill takes its JVM with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _out, err = child.communicate(timeout=_CHILD_BOUND_S)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")[-3000:]
    # batches 0..2 were written before the kill, batch 2 not marked done by Spark
    written = _values(spark, server.endpoint, 61)
    assert len(written) == (_KILL_AFTER_BATCH + 1) * _PER_TRIGGER

    _foreach_batch_copy(spark, server.endpoint, checkpoint)  # replays batch 2, then 3 and 4

    assert _values(spark, server.endpoint, 61) == expected  # every row once


def test_batch_write_with_sink_id_and_batch_id_commits_once(spark, server):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(f"r-{i}".encode(),) for i in range(300)], "value binary")

    def write(batch_id: int) -> None:
        (
            df.repartition(3)
            .write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 62)
            .option("sinkId", "once")
            .option("batchId", batch_id)
            .mode("append")
            .save()
        )

    write(7)
    write(7)  # the same (sinkId, batchId): nothing appended
    assert len(_values(spark, server.endpoint, 62)) == 300
    write(8)  # another batch id: appended
    assert len(_values(spark, server.endpoint, 62)) == 600


def test_batch_id_without_sink_id_or_in_a_streaming_write_is_refused(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(b"x",)], "value binary")
    with raises_project(ConfigurationError, "sinkId"):
        (
            df.write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 63)
            .option("batchId", 1)
            .mode("append")
            .save()
        )
    _publish(server.endpoint, 64, [b"a"])
    query = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 64)
        .load()
        .select("value")
        .writeStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 65)
        .option("sinkId", "s")
        .option("batchId", 3)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:  # a streaming sink's options are checked when its first batch is planned
        with raises_project(ConfigurationError, "no batchId for a streaming write"):
            query.awaitTermination(_CHILD_BOUND_S)
    finally:
        query.stop()


def test_a_stream_id_column_routes_each_row_to_its_stream(spark, server):  # type: ignore[no-untyped-def]
    """Issue 32 item 3: rows with stream_id 71 and 72 go to streams 71 and 72 (they all went to
    streamId before), committed together once per (sinkId, batchId)."""
    rows = [(f"r-{i}".encode(), 71 + i % 2) for i in range(400)]
    df = spark.createDataFrame(rows, "value binary, stream_id int").repartition(3)

    def write() -> None:
        (
            df.write.format("aeron")
            .option("endpoint", server.endpoint)
            .option("sinkId", "router")
            .option("batchId", 0)
            .mode("append")
            .save()
        )

    write()
    write()  # the same (sinkId, batchId): nothing appended to either stream
    for stream_id in (71, 72):
        assert _values(spark, server.endpoint, stream_id) == sorted(
            v for v, s in rows if s == stream_id
        )
    # a record format: the column routes and is not written into the messages
    docs = spark.createDataFrame(
        [(1, "a", 73), (2, "b", 74)], "id long, name string, stream_id int"
    )
    docs.write.format("aeron").option("endpoint", server.endpoint).option("format", "json").mode(
        "append"
    ).save()
    for stream_id, name in ((73, "a"), (74, "b")):
        back = (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", stream_id)
            .load()
        )
        assert [bytes(r.value) for r in back.collect()] == [
            f'{{"id":{1 if name == "a" else 2},"name":"{name}"}}'.encode()
        ]


def test_a_streaming_write_routes_by_a_stream_id_column(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    payloads = [f"s-{i}".encode() for i in range(300)]
    _publish(server.endpoint, 77, payloads)
    src = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 77)
        .option("maxMessagesPerTrigger", 100)
        .load()
    )
    routed = src.select(  # the source's own stream_id column (77) replaced by the route
        "value",
        F.expr("78 + cast(substring(cast(value as string), 3) as int) % 2").alias("stream_id"),
    )
    query = (
        routed.writeStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("sinkId", "stream-router")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(_CHILD_BOUND_S)
    assert query.exception() is None
    for stream_id in (78, 79):
        assert _values(spark, server.endpoint, stream_id) == sorted(
            p for i, p in enumerate(payloads) if 78 + i % 2 == stream_id
        )


def test_stream_id_option_beside_the_column_wins_and_a_null_stream_id_is_refused(spark, server):  # type: ignore[no-untyped-def]
    """With streamId given, every row goes there (Kafka's topic option over a topic column: a
    copy of a source DataFrame keeps working; the driver logs that the column routes nothing).
    Routing by the column, a null stream id fails the write naming the column."""
    df = spark.createDataFrame([(b"x", 76)], "value binary, stream_id int")
    df.write.format("aeron").option("endpoint", server.endpoint).option("streamId", 75).mode(
        "append"
    ).save()
    assert _values(spark, server.endpoint, 75) == [b"x"]
    nulls = spark.createDataFrame([(b"y", None)], "value binary, stream_id int")
    with raises_project(ConfigurationError, "a stream id in every row"):
        nulls.write.format("aeron").option("endpoint", server.endpoint).mode("append").save()
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        assert client.list_recordings([76]) == []  # nothing routed by the column
        assert _values(spark, server.endpoint, 75) == [b"x"]

"""``readOn=driver``: the driver reads each micro-batch while planning it (Spark's prefetching
path for Python sources). Same rows, same offsets, same exactly-once behaviour as reading on
executors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chispa import assert_df_equality

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


def publish(endpoint: str, stream_id: int, payloads: list[bytes]) -> None:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(stream_id, payloads)


def source(spark, endpoint: str, stream_id: int, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("aeron").option("endpoint", endpoint)
    reader = reader.option("streamId", stream_id).option("readOn", "driver")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_batches(df, checkpoint: Path) -> dict[int, list[tuple[int, int, bytes]]]:  # type: ignore[no-untyped-def]
    """Run ``df`` with Trigger.AvailableNow; the rows of each micro-batch by batch id."""
    seen: dict[int, list[tuple[int, int, bytes]]] = {}

    def each(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = batch.select("recording_id", "position", "value").collect()
        seen[batch_id] = sorted((r.recording_id, r.position, bytes(r.value)) for r in rows)

    query = (
        df.writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "query did not finish"
    assert query.exception() is None
    return seen


def test_driver_reads_every_message_once_like_executors(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    sent = {p: [f"p{p}-{i:05d}".encode() + bytes(p * 500) for i in range(2000)] for p in range(3)}
    for payloads in sent.values():
        publish(server.endpoint, 30, payloads)
    seen = run_batches(
        source(spark, server.endpoint, 30, maxMessagesPerTrigger="1500"), tmp_path / "ckpt"
    )
    assert len(seen) >= 4  # 6000 messages, at most 1500 a batch
    assert all(len(rows) <= 1500 for rows in seen.values())
    rows = [r for b in sorted(seen) for r in seen[b]]
    assert len(rows) == 6000 and len(set(rows)) == 6000
    by_recording: dict[int, list[tuple[int, bytes]]] = {}
    for rid, pos, value in rows:
        by_recording.setdefault(rid, []).append((pos, value))
    got = {v[0][1][:2]: [value for _, value in sorted(v)] for v in by_recording.values()}
    assert got == {f"p{p}".encode(): sent[p] for p in range(3)}

    # the same rows, columns and types as a batch read on executors
    executors = (
        spark.read.format("aeron").option("endpoint", server.endpoint).option("streamId", 30).load()
    )
    streamed = source(spark, server.endpoint, 30)
    assert streamed.schema == executors.schema
    q = (
        streamed.writeStream.format("memory")
        .queryName("driver_all")
        .option("checkpointLocation", str(tmp_path / "ckpt2"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300) and q.exception() is None
    assert_df_equality(
        spark.sql("SELECT * FROM driver_all"),
        executors,
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_restart_rereads_an_uncommitted_batch_with_the_same_rows(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    publish(server.endpoint, 31, [b"a-%05d" % i for i in range(900)])
    checkpoint = tmp_path / "ckpt"
    first = run_batches(source(spark, server.endpoint, 31, maxMessagesPerTrigger="300"), checkpoint)
    assert sorted(first) == [0, 1, 2]
    # Forget that the last batch committed: the restarted query must run it again. Its rows are
    # not in the driver's cache any more (a new query), so they are read through
    # readBetweenOffsets: they must be the same rows.
    for name in ("2", ".2.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    publish(server.endpoint, 31, [b"b-%05d" % i for i in range(300)])
    second = run_batches(
        source(spark, server.endpoint, 31, maxMessagesPerTrigger="300"), checkpoint
    )
    assert second[2] == first[2]
    assert sorted(second) == [2, 3]
    assert [v for _, _, v in second[3]] == [b"b-%05d" % i for i in range(300)]
    offsets = json.loads((checkpoint / "offsets" / "3").read_text().splitlines()[-1])
    assert sum(offsets.values()) > 0


def test_restart_from_checkpoint_continues_without_gap_or_duplicate(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    checkpoint = tmp_path / "ckpt"
    publish(server.endpoint, 32, [b"x-%05d" % i for i in range(500)])
    first = run_batches(source(spark, server.endpoint, 32), checkpoint)
    publish(server.endpoint, 32, [b"y-%05d" % i for i in range(700)])
    second = run_batches(source(spark, server.endpoint, 32), checkpoint)
    values = [v for seen in (first, second) for b in sorted(seen) for _, _, v in seen[b]]
    assert values == [b"x-%05d" % i for i in range(500)] + [b"y-%05d" % i for i in range(700)]


def test_read_on_options_are_checked(spark, server):  # type: ignore[no-untyped-def]
    with raises_project(ConfigurationError, "readOn"):
        source(spark, server.endpoint, 33, readOn="nowhere")
    with raises_project(ConfigurationError, "minPartitions"):
        source(spark, server.endpoint, 33, minPartitions="4")
    with raises_project(ConfigurationError, "readOn"):
        (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 33)
            .option("readOn", "driver")
            .load()
            .collect()
        )
    with pytest.raises(ConfigurationError, match="readOn"):
        from aeron_spark.connector.options import parse_source_options

        parse_source_options({"streamId": "1", "readOn": "both"})

"""``format("aeron").option("archive", ...)`` as a sink: Spark writes into the real Aeron Archive
(``io.aeron.archive.ArchivingMediaDriver`` from the pinned aeron-all jar, started by the fixture
on a free loopback port, stopped in a ``finally``), exactly once per (sinkId, batch), and the
archive source reads it back.

A batch write read back byte for byte (binary with reserved values, and json); a streaming copy
from one archived stream to another whose first task attempt is killed (-9 of its Python
worker), then restarted with its last batch out of Spark's commit log so that batch is
committed again: every row exactly once. Skips without Java only; fails instead with
``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import aeron_peer  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import BinaryType  # noqa: E402

from aeron_spark.errors import ConfigurationError  # noqa: E402
from aeron_spark.transport import Driver, DriverConfig  # noqa: E402
from aeron_spark.transport.archive.client import ArchiveClient, RecordingSignal  # noqa: E402
from aeron_spark.transport.testing import free_udp_port  # noqa: E402
from spark_tests._errors import raises_project  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(400)]
_WAIT_S = 60.0
_QUERY_S = 240  # one availableNow run of the streaming copy (bounded; takes seconds)
# The streaming copy: two recordings of a few rows, two micro-batches (the second one is
# committed again after the restart); the rows prove exactly once, their count proves nothing.
_ROWS_PER_RECORDING = 30
_ROWS_PER_TRIGGER = 40


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aeron_peer.JavaArchive]:
    aeron_peer.require_java()
    base = tmp_path_factory.mktemp("archive-sink")
    with aeron_peer.JavaArchive(base / "archive", free_udp_port(), 4712) as peer:
        yield peer


def _sink_options(archive: aeron_peer.JavaArchive, stream_id: int) -> dict[str, str]:
    return {
        "archive": archive.control_channel,
        "channel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
        "streamId": str(stream_id),
        "timeoutMs": "30000",
    }


def _read(spark, archive: aeron_peer.JavaArchive, stream_id: int, **options: object):  # type: ignore[no-untyped-def]
    reader = spark.read.format("aeron").option("archive", archive.control_channel)
    reader = reader.option("streamId", stream_id).option("timeoutMs", 30000)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_write_then_read_back_byte_for_byte(spark, archive) -> None:  # type: ignore[no-untyped-def]
    rows = [(bytes([i % 251]) * (1 + (i * 53) % 2500), i * 7) for i in range(2000)]
    sliced = spark.sparkContext.parallelize(rows, 4)  # partition p holds a contiguous slice
    df = spark.createDataFrame(sliced, "value binary, reserved_value bigint")
    df.write.format("aeron").options(**_sink_options(archive, 5001)).mode("append").save()
    got = _read(spark, archive, 5001).orderBy("position").collect()
    assert [(bytes(r.value), r.reserved_value) for r in got] == rows  # in partition order
    docs = [{"id": i, "name": f"n{i}"} for i in range(300)]
    spark.createDataFrame(docs, "id long, name string").write.format("aeron").options(
        **_sink_options(archive, 5002), format="json", sinkId="docs"
    ).mode("append").save()
    back = _read(spark, archive, 5002, format="json", schema="id long, name string")
    assert sorted((r.id, r.name) for r in back.collect()) == [(d["id"], d["name"]) for d in docs]


def test_batch_write_with_sink_id_and_batch_id_is_appended_once(spark, archive) -> None:  # type: ignore[no-untyped-def]
    """Issue 32: a foreachBatch batch replayed after a failure writes its (sinkId, batchId)
    again; the archive sink finds that batch's END marker ending the target and appends
    nothing. A stream_id column without streamId is refused (the archive sink does not route
    rows)."""
    options = dict(_sink_options(archive, 5005), sinkId="fb-archive")
    df = spark.createDataFrame([(f"a-{i}".encode(),) for i in range(50)], "value binary")
    for batch_id in (4, 4, 5):  # batch 4 written twice (the replay), then batch 5
        df.repartition(2).write.format("aeron").options(**options, batchId=batch_id).mode(
            "append"
        ).save()
    got = sorted(bytes(r.value) for r in _read(spark, archive, 5005).collect())
    assert got == sorted([f"a-{i}".encode() for i in range(50)] * 2)
    routed = spark.createDataFrame([(b"x", 5006)], "value binary, stream_id int")
    unrouted = {k: v for k, v in options.items() if k != "streamId"}
    with raises_project(ConfigurationError, "does not route rows by a stream_id column"):
        routed.write.format("aeron").options(**unrouted).mode("append").save()


def _killer(flag: str):  # type: ignore[no-untyped-def]
    """A UDF that kills (-9) its Python worker on the first attempt of partition 0 of the first
    batch that reaches it, after leaving ``flag`` behind as proof (once: later batches and the
    retry go through)."""

    @F.udf(BinaryType())
    def kill_first_attempt(value):  # type: ignore[no-untyped-def]  (no hints: a plain row UDF)
        import os
        import signal

        from pyspark import TaskContext

        ctx = TaskContext.get()
        if (
            ctx is not None
            and ctx.attemptNumber() == 0
            and ctx.partitionId() == 0
            and not os.path.exists(flag)
        ):
            with open(flag, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 of this task's Python worker
        return value

    return kill_first_attempt


def test_streaming_copy_with_a_killed_task_and_a_recommitted_batch_is_exactly_once(  # type: ignore[no-untyped-def]
    spark, archive, tmp_path: Path
) -> None:
    driver = Driver(DriverConfig(directory=tmp_path / "driver", write_counters_file=False)).start()
    client = ArchiveClient.connect(archive.control_channel, driver, timeout_s=_WAIT_S)
    try:
        expected = []
        for n in range(2):  # two recordings of the source stream: two read tasks per batch
            channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
            sub_id = client.start_recording(channel, 5010, auto_stop=True)
            with driver.add_publication(channel + "|term-length=65536", 5010) as pub:
                assert pub.wait_until_connected(_WAIT_S)
                client.wait_for_signal(
                    lambda e, s=sub_id: e.subscription_id == s and e.signal == RecordingSignal.START
                )
                for i in range(_ROWS_PER_RECORDING):
                    payload = b"r%d-%04d" % (n, i)
                    pub.offer_blocking(payload, timeout_s=_WAIT_S)
                    expected.append(payload)
            # closed: drained to the archive, then end of stream stops the recording (no polling)
            client.wait_for_signal(
                lambda e, s=sub_id: e.subscription_id == s and e.signal == RecordingSignal.STOP
            )
        sink = _sink_options(archive, 5011)
        ckpt, flag = tmp_path / "ckpt", tmp_path / "killed"

        def run(kill: bool) -> None:
            values = (
                spark.readStream.format("aeron")
                .option("archive", archive.control_channel)
                .option("streamId", 5010)
                .option("maxMessagesPerTrigger", _ROWS_PER_TRIGGER)
                .load()
                .select("value")
            )
            if kill:
                values = values.select(_killer(str(flag))("value").alias("value"))
            query = (
                values.writeStream.format("aeron")
                .options(**sink, sinkId="copy")
                .option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(_QUERY_S)
            assert query.exception() is None

        run(kill=True)
        assert flag.exists()  # the first attempt was killed; its retry staged again
        commits = sorted(
            (p for p in (ckpt / "commits").iterdir() if p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        assert len(commits) >= 2  # more rows than one batch takes
        last = commits[-1]
        last.unlink()  # the driver "died" after the append, before Spark's commit log
        (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
        run(kill=False)  # the restart re-runs the last batch and commits it again
        assert (ckpt / "commits" / last.name).exists()
        got = [bytes(r.value) for r in _read(spark, archive, 5011).collect()]
        assert sorted(got) == sorted(expected)  # every row exactly once
    finally:
        client.close()
        driver.close()

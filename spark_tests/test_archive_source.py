"""``format("aeron").option("archive", ...)``: Spark reads the recordings of the real Aeron
Archive (``io.aeron.archive.ArchivingMediaDriver`` from the pinned aeron-all jar, started by the
fixture with a UDP control channel on a free loopback port, stopped in a ``finally``).

Our publisher writes a stream the archive records; Spark reads it back byte for byte in a batch
(whole, split into tasks, in the json format) and as a stream with
``Trigger.AvailableNow`` (limited micro-batches at message boundaries, then only what was
recorded since, from the checkpoint). Skips without Java only; fails instead with
``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import aeron_peer  # noqa: E402

from aeron_spark.transport import Driver, DriverConfig  # noqa: E402
from aeron_spark.transport.archive.client import ArchiveClient, RecordingSignal  # noqa: E402
from aeron_spark.transport.testing import free_udp_port  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(300)]

_WAIT_S = 60.0
ARCHIVE_ID = 4711


class Recorded:
    """The archive, our driver and a control session, to record streams our publishers write."""

    def __init__(self, archive: aeron_peer.JavaArchive, driver: Driver) -> None:
        self.archive = archive
        self.driver = driver
        self.client = ArchiveClient.connect(archive.control_channel, driver, timeout_s=_WAIT_S)

    def record(self, stream_id: int, messages: list[bytes]) -> tuple[object, str, int]:
        """A new recording of ``messages`` (left active): (publication, channel, recording id)."""
        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        sub_id = self.client.start_recording(channel, stream_id)
        pub = self.driver.add_publication(channel + "|term-length=65536", stream_id)
        assert pub.wait_until_connected(_WAIT_S)
        rid = self.client.wait_for_signal(
            lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
        ).recording_id
        self.append(pub, rid, messages)
        return pub, channel, rid

    def append(self, pub, rid: int, messages: list[bytes]) -> None:  # type: ignore[no-untyped-def]
        for m in messages:
            pub.offer_blocking(m, timeout_s=_WAIT_S)
        deadline = time.monotonic() + _WAIT_S
        while self.client.recording_position(rid) < pub.position:
            assert time.monotonic() < deadline, "the archive did not record everything"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    aeron_peer.require_java()
    base = tmp_path_factory.mktemp("archive-source")
    driver = Driver(DriverConfig(directory=base / "driver", write_counters_file=False)).start()
    try:
        with aeron_peer.JavaArchive(base / "archive", free_udp_port(), ARCHIVE_ID) as archive:
            r = Recorded(archive, driver)
            try:
                yield r
            finally:
                r.client.close()
    finally:
        driver.close()


def _read(spark, recorded: Recorded, stream_id: int, **options: object):  # type: ignore[no-untyped-def]
    reader = spark.read.format("aeron").option("archive", recorded.archive.control_channel)
    reader = reader.option("streamId", stream_id).option("timeoutMs", 30000)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_is_byte_for_byte(spark, recorded: Recorded) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    messages = [rng.randbytes(1 + (i * 211) % 3000) for i in range(600)]  # some fragmented
    pub, channel, rid = recorded.record(3001, messages)
    other = [b"other stream"] * 5
    recorded.record(3002, other)
    session_id = recorded.client.list_recording(rid).session_id
    rows = _read(spark, recorded, 3001).orderBy("position").collect()
    assert [bytes(r.value) for r in rows] == messages
    assert {(r.recording_id, r.stream_id, r.session_id) for r in rows} == {(rid, 3001, session_id)}
    # Split into term-aligned tasks (64 KiB terms): the same rows, none twice.
    df = _read(spark, recorded, 3001, minPartitions=4)
    assert df.rdd.getNumPartitions() >= 4
    split = df.orderBy("position").collect()
    assert [(bytes(r.value), r.position) for r in split] == [
        (bytes(r.value), r.position) for r in rows
    ]
    # Within one term (issue 32 item 7: cuts fell only on term boundaries, so 1 partition for
    # 5): as many partitions as asked, each replayed from the term start, the same rows.
    small = [b"s%05d" % i + b"y" * (i % 300) for i in range(200)]  # about 32 KiB
    small_pub, _, _ = recorded.record(3003, small)
    df = _read(spark, recorded, 3003, minPartitions=5)
    assert df.rdd.getNumPartitions() == 5
    assert [bytes(r.value) for r in df.orderBy("position").collect()] == small
    small_pub.close()
    # The channel filter, and ending/starting positions as offsets.
    key = f"{ARCHIVE_ID}/{rid}"
    assert _read(spark, recorded, 3001, channel=channel).count() == len(messages)
    assert _read(spark, recorded, 3001, channel="aeron:udp?endpoint=127.0.0.1:1|").count() == 0
    mid = rows[300].position
    head = _read(spark, recorded, 3001, endingPositions=json.dumps({key: mid})).collect()
    tail = _read(spark, recorded, 3001, startingPositions=json.dumps({key: mid})).collect()
    assert sorted(bytes(r.value) for r in head) == sorted(messages[:300])
    assert sorted(bytes(r.value) for r in tail) == sorted(messages[300:])
    pub.close()


def test_json_format_through_the_archive(spark, recorded: Recorded) -> None:  # type: ignore[no-untyped-def]
    docs = [{"id": i, "name": f"n{i}", "score": i * 0.5} for i in range(200)]
    pub, _, _ = recorded.record(3011, [json.dumps(d).encode() for d in docs])
    df = _read(spark, recorded, 3011, format="json", schema="id long, name string, score double")
    assert [r.asDict() for r in df.orderBy("id").collect()] == docs
    inferred = _read(spark, recorded, 3011, format="json")
    assert set(inferred.columns) >= {"id", "name", "score"}
    pub.close()


def test_available_now_stream_then_only_new_data(  # type: ignore[no-untyped-def]
    spark, recorded: Recorded, tmp_path: Path
) -> None:
    first = [b"first-%04d" % i + b"x" * (i % 50) for i in range(300)]
    pub, _, rid = recorded.record(3021, first)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> int:
        query = (
            spark.readStream.format("aeron")
            .option("archive", recorded.archive.control_channel)
            .option("streamId", 3021)
            .option("maxMessagesPerTrigger", 70)
            .load()
            .select("value", "position", "recording_id")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(240)
        assert query.exception() is None
        return len(query.recentProgress)

    batches = run()
    assert batches >= 300 // 70  # limited micro-batches
    rows = spark.read.parquet(str(out)).orderBy("position").collect()
    assert [bytes(r.value) for r in rows] == first
    later = [b"later-%04d" % i for i in range(120)]
    recorded.append(pub, rid, later)
    run()
    rows = spark.read.parquet(str(out)).orderBy("position").collect()
    assert [bytes(r.value) for r in rows] == first + later  # each once
    pub.close()


def test_live_query_sees_new_recordings_and_data_arrive(  # type: ignore[no-untyped-def]
    spark, recorded: Recorded, tmp_path: Path
) -> None:
    pub, _, rid = recorded.record(3031, [b"before-%d" % i for i in range(20)])
    out = tmp_path / "out"
    query = (
        spark.readStream.format("aeron")
        .option("archive", recorded.archive.control_channel)
        .option("streamId", 3031)
        .load()
        .select("value", "position", "recording_id")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        query.processAllAvailable()  # returns once the query has read all the source offers
        assert sorted(bytes(r.value) for r in spark.read.parquet(str(out)).collect()) == sorted(
            b"before-%d" % i for i in range(20)
        )
        recorded.append(pub, rid, [b"after-%d" % i for i in range(30)])
        pub2, _, rid2 = recorded.record(3031, [b"second-%d" % i for i in range(10)])
        query.processAllAvailable()
        got = spark.read.parquet(str(out)).collect()
        expected = sorted(
            [b"before-%d" % i for i in range(20)]
            + [b"after-%d" % i for i in range(30)]
            + [b"second-%d" % i for i in range(10)]
        )
        assert sorted(bytes(r.value) for r in got) == expected
        assert {r.recording_id for r in got} == {rid, rid2}
        assert query.exception() is None
    finally:
        query.stop()
        pub.close()
    pub2.close()


def test_truncated_range_fails_clearly_or_is_skipped(  # type: ignore[no-untyped-def]
    spark, recorded: Recorded
) -> None:
    messages = [b"t" * 100] * 20  # 160-byte frames
    pub, channel, rid = recorded.record(3041, messages)
    recorded.client.stop_recording(channel, 3041)
    recorded.client.wait_for_signal(
        lambda e: e.recording_id == rid and e.signal == RecordingSignal.STOP
    )
    recorded.client.truncate_recording(rid, 160 * 10)
    key = f"{ARCHIVE_ID}/{rid}"
    assert _read(spark, recorded, 3041).count() == 10
    beyond = json.dumps({key: 160 * 15})  # an offset read before the truncation
    with pytest.raises(Exception, match="truncated"):
        _read(spark, recorded, 3041, startingPositions=beyond).collect()
    assert (
        _read(spark, recorded, 3041, startingPositions=beyond, failOnDataLoss="false").count() == 0
    )
    pub.close()


def test_archive_restarted_mid_query_fails_clearly_then_resumes_from_checkpoint(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path
) -> None:
    """kill -9 of the archive between micro-batches: the next run of the query fails clearly
    (within timeoutMs); the archive restarted on the same directory, the query resumes from its
    checkpoint: every row once, old recording and new."""
    aeron_peer.require_java()
    port, archive_dir = free_udp_port(), tmp_path / "archive"
    driver = Driver(DriverConfig(directory=tmp_path / "driver", write_counters_file=False)).start()
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run(control: str) -> object:
        query = (
            spark.readStream.format("aeron")
            .option("archive", control)
            .option("streamId", 3051)
            .option("timeoutMs", 20000)
            .load()
            .select("value", "recording_id")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        from pyspark.errors import StreamingQueryException

        try:
            query.awaitTermination(240)
        except StreamingQueryException as exc:
            return exc
        return query.exception()

    try:
        archive = aeron_peer.JavaArchive(archive_dir, port, 17, tag="archive-restart")
        try:
            r = Recorded(archive, driver)
            pub, _, rid = r.record(3051, [b"one-%d" % i for i in range(50)])
            assert run(archive.control_channel) is None
            archive.kill()
            started = time.monotonic()
            error = run(archive.control_channel)
            assert error is not None and "archive" in str(error).lower(), error
            assert time.monotonic() - started < 120
            r.client.close()
            pub.close()
        finally:
            archive.close()
        with aeron_peer.JavaArchive(archive_dir, port, 17, tag="archive-restart") as again:
            r = Recorded(again, driver)
            pub2, _, rid2 = r.record(3051, [b"two-%d" % i for i in range(30)])
            assert run(again.control_channel) is None
            rows = spark.read.parquet(str(out)).collect()
            assert sorted(bytes(x.value) for x in rows) == sorted(
                [b"one-%d" % i for i in range(50)] + [b"two-%d" % i for i in range(30)]
            )
            assert {x.recording_id for x in rows} == {rid, rid2}
            r.client.close()
            pub2.close()
    finally:
        driver.close()

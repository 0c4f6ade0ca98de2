"""A streaming query writing into the archive with ``replicas`` and ``minInSyncReplicas``
(issue 30), against real Java archives (``aeron_peer.java_archives``: a primary and one replica,
free loopback ports, stopped after).

With ``minInSyncReplicas=3`` and one of its two replicas down (nothing answers on its control
channel, as for a dead host) the query fails and reports the sink's ``NotEnoughReplicasError``
(code ``NOT_ENOUGH_REPLICAS``); nothing is visible to a committed-only reader. Restarted from
its checkpoint with ``minInSyncReplicas=2`` it writes every row exactly once, and the replica's
copy ends where the primary's target does. Skips without Java only; fails instead with
``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import aeron_peer  # noqa: E402

from aeron_spark.connector.errors import NotEnoughReplicasError  # noqa: E402
from aeron_spark.connector.options import parse_archive_sink_options  # noqa: E402
from aeron_spark.connector.stores.archive import sink as archive_sink  # noqa: E402
from aeron_spark.connector.stores.archive.replicas import find_copy  # noqa: E402
from aeron_spark.transport import Driver, DriverConfig  # noqa: E402
from aeron_spark.transport.archive.client import ArchiveClient, RecordingSignal  # noqa: E402
from aeron_spark.transport.testing import free_udp_port  # noqa: E402
from spark_tests._errors import raises_project  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(400)]
_WAIT_S = 60.0
_QUERY_S = 240
_ROWS = 60
_ROWS_PER_TRIGGER = 25


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[aeron_peer.JavaArchive]]:
    aeron_peer.require_java()
    root = tmp_path_factory.mktemp("spark-sink-replicas")
    with aeron_peer.java_archives(root, ["spark-primary", "spark-replica-b"], 0x5B1) as started:
        yield started


def _record_source(primary: aeron_peer.JavaArchive, tmp_path: Path, stream_id: int) -> list[bytes]:
    """A stopped recording of ``_ROWS`` messages of ``stream_id`` on the primary (the query's
    input)."""
    driver = Driver(DriverConfig(directory=tmp_path / "driver", write_counters_file=False)).start()
    try:
        with ArchiveClient.connect(primary.control_channel, driver, timeout_s=_WAIT_S) as client:
            channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
            sub_id = client.start_recording(channel, stream_id, auto_stop=True)
            rows = [b"row-%04d" % i for i in range(_ROWS)]
            with driver.add_publication(channel + "|term-length=65536", stream_id) as pub:
                assert pub.wait_until_connected(_WAIT_S)
                client.wait_for_signal(
                    lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
                )
                for row in rows:
                    pub.offer_blocking(row, timeout_s=_WAIT_S)
            client.wait_for_signal(
                lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.STOP
            )
        return rows
    finally:
        driver.close()


def test_not_enough_replicas_fails_the_query_then_every_row_once(  # type: ignore[no-untyped-def]
    spark, archives, tmp_path: Path
) -> None:
    primary, b = archives
    expected = _record_source(primary, tmp_path, 5101)
    down = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"  # no archive answers there
    sink = {
        "archive": primary.control_channel,
        "channel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
        "streamId": "5102",
        "sinkId": "replicated",
        "timeoutMs": "30000",
        "replicas": f"{b.control_channel},{down}",
    }
    ckpt = tmp_path / "ckpt"

    def run(min_insync: int):  # type: ignore[no-untyped-def]
        values = (
            spark.readStream.format("aeron")
            .option("archive", primary.control_channel)
            .option("streamId", 5101)
            .option("maxMessagesPerTrigger", _ROWS_PER_TRIGGER)
            .load()
            .select("value")
        )
        return (
            values.writeStream.format("aeron")
            .options(**sink, minInSyncReplicas=str(min_insync))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )

    def committed() -> list[bytes]:
        reader = spark.read.format("aeron").option("archive", primary.control_channel)
        return [bytes(r.value) for r in reader.option("streamId", 5102).load().collect()]

    query = run(3)
    with raises_project(NotEnoughReplicasError, "minInSyncReplicas=3.*unreachable"):
        query.awaitTermination(_QUERY_S)
    assert committed() == []  # nothing of the failed batch for a committed-only reader
    query = run(2)  # restarted from its checkpoint with the dead replica still down
    assert query.awaitTermination(_QUERY_S)
    assert query.exception() is None
    assert sorted(committed()) == sorted(expected)  # every row exactly once
    o = parse_archive_sink_options({**sink, "minInSyncReplicas": "2"})
    with archive_sink.connect(o.connect) as client:
        target = archive_sink.ArchiveCommitter(o, "x", client).target()
        assert target is not None
        with ArchiveClient.connect(b.control_channel, client.driver, timeout_s=_WAIT_S) as replica:
            copy = find_copy(replica, target)
            assert copy is not None and copy.stop_position == target.stop_position

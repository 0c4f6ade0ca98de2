"""kill -9 of the primary archive during a streaming read (issue 30): the query goes on from a
replica without a restart, every row exactly once in its parquet output.

Three real ``ArchivingMediaDriver``s (``aeron_peer.archive_set``: sleeping idle strategies, free
ports, stopped by the test): ``primary`` records our live multi-destination publication,
``second`` and ``third`` replicate it with a live merge (so they record the live stream
themselves once merged). A writer publishes a few seconds of rows while a
``readStream.format("aeron").option("archive", "<primary>,<second>,<third>")`` query writes them
to parquet; the primary is killed mid-stream. The time from the kill to the first micro-batch
that started after it and read rows is printed (``benchmarks/failover.py --read`` measures it
alone). Skips without Java only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import aeron_peer  # noqa: E402

from aeron_spark.transport import Driver, DriverConfig  # noqa: E402
from aeron_spark.transport.archive.client import (  # noqa: E402
    ArchiveClient,
    RecordingSignal,
    ReplicationParams,
)

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(600)]

_WAIT_S = 60.0
STREAM_ID = 3701
ROWS = 3000  # about 3 s of writing


def _wait(what: str, condition: object, timeout_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _recorded(channel: str, driver: Driver, end: int) -> None:
    """Wait until the archive on ``channel`` recorded the stream up to ``end``."""
    with ArchiveClient.connect(channel, driver, timeout_s=_WAIT_S) as c:
        (d,) = c.list_recordings_for_uri("", STREAM_ID)
        _wait(
            f"{channel} recorded up to {end}",
            lambda: (
                max(c.recording_position(d.recording_id), c.stop_position(d.recording_id)) >= end
            ),
        )


def _since(progress: dict, wall: float) -> bool:
    """Whether a progress report's batch started at or after the wall-clock time ``wall``."""
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
    return started.timestamp() >= wall


def test_kill_9_of_the_primary_during_a_streaming_read(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    aeron_peer.require_java()
    rows = [b"row-%06d" % i for i in range(ROWS)]
    driver = Driver(DriverConfig(directory=tmp_path / "driver", write_counters_file=False)).start()
    writer: threading.Thread | None = None
    try:
        with aeron_peer.archive_set(
            tmp_path / "archives", [("primary", 0x31A), ("second", 0x31B), ("third", 0x31C)]
        ) as archives:
            primary = archives["primary"].control_channel
            live = f"aeron:udp?control=127.0.0.1:{aeron_peer.free_udp_port()}|control-mode=dynamic"
            with ArchiveClient.connect(primary, driver, timeout_s=_WAIT_S) as client:
                sub_id = client.start_recording(live, STREAM_ID)
                # 1 MiB terms hold every row: a receiver that falls behind gets what it lost
                # sent again (the flow control follows the fastest receiver, as Aeron's default)
                pub = driver.add_publication(live + "|term-length=1048576", STREAM_ID)
                assert pub.wait_until_connected(_WAIT_S)
                rid = client.wait_for_signal(
                    lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
                ).recording_id
            head = 300
            for m in rows[:head]:
                pub.offer_blocking(m, timeout_s=_WAIT_S)
            for name in ("second", "third"):
                with ArchiveClient.connect(
                    archives[name].control_channel, driver, timeout_s=_WAIT_S
                ) as copy:
                    replication = copy.replicate(
                        rid, primary, params=ReplicationParams(live_destination=live)
                    )
                    copy.wait_for_replication(replication, RecordingSignal.MERGE)
            failed: list[BaseException] = []

            def write() -> None:
                try:
                    for i, m in enumerate(rows[head:]):
                        pub.offer_blocking(m, timeout_s=_WAIT_S)
                        if i % 10 == 9:
                            time.sleep(0.01)  # about 1,000 rows/s
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    failed.append(exc)

            out = tmp_path / "out"
            query = (
                spark.readStream.format("aeron")
                .option("archive", ",".join(a.control_channel for a in archives.values()))
                .option("streamId", STREAM_ID)
                .option("timeoutMs", 5000)
                .option("maxMessagesPerTrigger", 500)
                .load()
                .select("value", "position")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(processingTime="500 milliseconds")
                .start()
            )
            try:
                writer = threading.Thread(target=write, name="failover-writer", daemon=True)
                writer.start()

                def read_so_far() -> int:
                    if not query.isActive:  # failed: say why now, not after the wait
                        raise AssertionError(f"the query stopped: {query.exception()}")
                    return sum(p["numInputRows"] for p in query.recentProgress)

                try:
                    _wait("the query read from the primary", lambda: read_so_far() >= 500, 180)
                except AssertionError:
                    rows_by_batch = [p["numInputRows"] for p in query.recentProgress]
                    raise AssertionError(f"{query.status} {rows_by_batch}") from None
                killed_wall, killed = time.time(), time.monotonic()
                archives["primary"].kill()
                _wait(
                    "a micro-batch after the kill read rows",
                    lambda: (
                        read_so_far() >= 0
                        and any(
                            p["numInputRows"] > 0 and _since(p, killed_wall)
                            for p in query.recentProgress
                        )
                    ),
                    120,
                )
                print(f"failover: kill -9 to the next progress {time.monotonic() - killed:.2f} s")
                writer.join(_WAIT_S)
                assert not writer.is_alive() and not failed, failed
                for name in ("second", "third"):
                    _recorded(archives[name].control_channel, driver, pub.position)
                query.processAllAvailable()
                assert query.exception() is None
            finally:
                query.stop()
            pub.close()
            got = [bytes(r.value) for r in spark.read.parquet(str(out)).collect()]
            assert len(got) == len(set(got)) == ROWS  # nothing twice, nothing missing
            assert sorted(got) == rows
    finally:
        if writer is not None:
            writer.join(_WAIT_S)
        driver.close()

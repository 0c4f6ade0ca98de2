"""The real Aeron Archive as a source: bounded replay MB/s, and Spark rows/s of the archive
source against the stream server's source on the same rows, in one run.

    python -m benchmarks.archive [--rows 200000] [--repeats 2] [--no-spark]

Needs Java and the pinned aeron-all jar (``python transport/tests/aeron_peer.py fetch``): an
``ArchivingMediaDriver`` is started on loopback (sleeping idle strategies, as in the tests) and
records ``--rows`` messages of 116 bytes that our publisher writes (two recordings, as the
server gets two producers). Prints one JSON object:

* ``replay_mb_per_s`` / ``replay_msgs_per_s``: one bounded replay of a whole recording through
  :class:`~aeron_spark.transport.archive.client.ArchiveClient` (raw frames, no Spark), best of
  ``--repeats``;
* ``archive_source_rows_per_s`` / ``server_source_rows_per_s``: ``spark.read.format("aeron")``
  into a ``noop`` sink on local[2], with ``option("archive", ...)`` and with ``endpoint``, taking
  turns (``benchmarks._timing.interleaved_best``), and their ratio ``archive_to_server_ratio``;
* ``archive_sink_rows_per_s`` / ``server_sink_rows_per_s``: ``df.write.format("aeron")`` of
  ``--rows`` binary rows of 116 bytes in two partitions (``spark.range``), exactly once into the
  archive (``option("archive", ...)``: tasks stage into staging recordings, the driver appends
  them to the target between markers) and into the stream server (``endpoint``), taking turns;
  their ratio ``archive_sink_to_server_sink_ratio``. Every archive write is counted back
  through the archive source.

The numbers depend on the load of the machine (the JSON has the load average at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))

MESSAGE_LENGTH = 116
STREAM = 5001


def _record(client, driver, rows: int, recordings: int) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    from aeron_spark.transport.archive.client import RecordingSignal
    from aeron_spark.transport.testing import free_udp_port

    out = []
    payload = bytes(MESSAGE_LENGTH)
    for _ in range(recordings):
        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        sub_id = client.start_recording(channel, STREAM)
        pub = driver.add_publication(channel, STREAM)
        if not pub.wait_until_connected(30):
            raise RuntimeError("the archive's recording subscription did not connect")
        rid = client.wait_for_signal(
            lambda e, s=sub_id: e.subscription_id == s and e.signal == RecordingSignal.START
        ).recording_id
        for _ in range(rows // recordings):
            pub.offer_blocking(payload, timeout_s=30)
        deadline = time.monotonic() + 120
        while client.recording_position(rid) < pub.position:
            if time.monotonic() > deadline:
                raise RuntimeError("the archive did not record everything")
            time.sleep(0.05)
        client.stop_recording_subscription(sub_id)
        end = pub.position
        pub.close()
        out.append((rid, end))
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-spark", action="store_true", help="replay figures only")
    args = p.parse_args()
    import aeron_peer
    from aeron_spark.transport import Driver, DriverConfig
    from aeron_spark.transport.archive.client import ArchiveClient
    from aeron_spark.transport.testing import free_udp_port

    reason = aeron_peer.unavailable_reason()
    if reason is not None:
        print(json.dumps({"error": f"the real Aeron (Java) is not available: {reason}"}))
        return 1
    result: dict[str, object] = {
        "rows": args.rows,
        "message_length": MESSAGE_LENGTH,
        "load_average_1m": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        driver = Driver(
            DriverConfig(directory=Path(tmp) / "driver", write_counters_file=False)
        ).start()
        try:
            with (
                aeron_peer.JavaArchive(Path(tmp) / "archive", free_udp_port(), 1) as archive,
                ArchiveClient.connect(archive.control_channel, driver, timeout_s=30) as client,
            ):
                recordings = _record(client, driver, args.rows, 2)
                rid, end = recordings[0]
                best = float("inf")
                for _ in range(args.repeats + 1):
                    started = time.perf_counter()
                    size = sum(len(b.data) for b in client.replay(rid, 0, end))
                    best = min(best, time.perf_counter() - started)
                result["replay_bytes"] = size
                result["replay_mb_per_s"] = round(end / best / 1e6, 1)
                result["replay_msgs_per_s"] = round(args.rows // 2 / best)
                if not args.no_spark:
                    result.update(_spark(archive.control_channel, args.rows, args.repeats, tmp))
        finally:
            driver.close()
    print(json.dumps(result))
    return 0


def _spark(control_channel: str, rows: int, repeats: int, tmp: str) -> dict[str, object]:
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.server import ServerConfig, StreamServer
    from pyspark.sql import SparkSession

    from benchmarks._timing import interleaved_best

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-archive")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ensure_registered(spark)
    out: dict[str, object] = {"master": "local[2]"}
    with StreamServer(ServerConfig(directory=os.path.join(tmp, "s"), port=0)) as server:
        payload = bytes(MESSAGE_LENGTH)
        for _ in range(2):
            with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as c:
                c.publish(STREAM, (payload for _ in range(rows // 2)))

        def archive_source() -> None:
            (
                spark.read.format("aeron")
                .option("archive", control_channel)
                .option("streamId", STREAM)
                .load()
                .write.format("noop")
                .mode("overwrite")
                .save()
            )

        def server_source() -> None:
            (
                spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", STREAM)
                .load()
                .write.format("noop")
                .mode("overwrite")
                .save()
            )

        counted = (
            spark.read.format("aeron")
            .option("archive", control_channel)
            .option("streamId", STREAM)
            .load()
            .count()
        )
        if counted != rows // 2 * 2:
            raise RuntimeError(f"the archive source read {counted} rows, not {rows}")
        best = interleaved_best({"archive": archive_source, "server": server_source}, repeats)
        out["archive_source_rows_per_s"] = round(rows / best["archive"])
        out["server_source_rows_per_s"] = round(rows / best["server"])
        out["archive_to_server_ratio"] = round(best["server"] / best["archive"], 3)
        out.update(_sinks(spark, control_channel, server.endpoint, rows, repeats))
    spark.stop()
    return out


def _sinks(spark, control_channel: str, endpoint: str, rows: int, repeats: int) -> dict:  # type: ignore[no-untyped-def]
    from aeron_spark.transport.testing import free_udp_port
    from pyspark.sql import functions as F

    from benchmarks._timing import interleaved_best

    df = spark.range(rows, numPartitions=2).select(
        F.lit(bytes(MESSAGE_LENGTH)).cast("binary").alias("value")
    )
    target = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    writes = [0]

    def archive_sink() -> None:
        (
            df.write.format("aeron")
            .option("archive", control_channel)
            .option("channel", target)
            .option("streamId", STREAM + 1)
            .option("sinkId", "bench")
            .mode("append")
            .save()
        )
        writes[0] += 1

    def server_sink() -> None:
        (
            df.write.format("aeron")
            .option("endpoint", endpoint)
            .option("streamId", STREAM + 1)
            .option("sinkId", "bench")
            .mode("append")
            .save()
        )

    best = interleaved_best({"archive": archive_sink, "server": server_sink}, repeats)
    counted = (
        spark.read.format("aeron")
        .option("archive", control_channel)
        .option("streamId", STREAM + 1)
        .load()
        .count()
    )
    if counted != rows * writes[0]:
        raise RuntimeError(f"the archive sink wrote {counted} rows, not {rows * writes[0]}")
    return {
        "archive_sink_rows_per_s": round(rows / best["archive"]),
        "server_sink_rows_per_s": round(rows / best["server"]),
        "archive_sink_to_server_sink_ratio": round(best["server"] / best["archive"], 3),
    }


if __name__ == "__main__":
    raise SystemExit(main())

"""The real Aeron Archive as a source and a sink: bounded replay MB/s, and Spark rows/s of
the archive source and sink against the stream server's on the same rows, in one run.

    python -m benchmarks.archive [--rows 200000] [--repeats 2] [--no-spark] [--java-replay]

Needs Java and the pinned aeron-all jar (``python transport/tests/aeron_peer.py fetch``): an
``ArchivingMediaDriver`` is started on loopback (sleeping idle strategies, as in the tests) and
records ``--rows`` messages of 116 bytes that our publisher writes (two recordings, as the
server gets two producers). Prints one JSON object:

* ``replay_mb_per_s`` / ``replay_msgs_per_s``: one bounded replay of a whole recording through
  :class:`~aeron_spark.transport.archive.client.ArchiveClient` (raw frames, no Spark), best of
  ``--repeats``; with ``--java-replay``, taking turns with it (``interleaved_best``),
  ``replay_java_mb_per_s``: the same replay read by a Java consumer (``AeronArchive.replay`` and
  ``Image.blockPoll``, backoff idle strategy, on its own Java media driver with Aeron's
  defaults: the reference), and ``replay_to_java_ratio`` (needs ``javac``). Opt-in: the second
  JVM (its start, its JIT, its idle strategy) takes CPU from our replay on a small machine;
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


# A Java replay consumer: one bounded replay of the recording per line read on stdin, answered
# with the bytes it received.
_JAVA_REPLAY = r"""
import io.aeron.Image;
import io.aeron.Subscription;
import io.aeron.archive.client.AeronArchive;
import io.aeron.logbuffer.BlockHandler;
import org.agrona.concurrent.BackoffIdleStrategy;
import org.agrona.concurrent.IdleStrategy;

public class BenchReplay {
    public static void main(String[] args) throws Exception {
        long recordingId = Long.parseLong(args[1]);
        long length = Long.parseLong(args[2]);
        final long[] got = {0};
        BlockHandler handler = (buffer, offset, len, sessionId, termId) -> got[0] += len;
        IdleStrategy idle = new BackoffIdleStrategy();
        java.io.BufferedReader in =
            new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
        try (AeronArchive archive = AeronArchive.connect(new AeronArchive.Context()
                .controlRequestChannel(args[0])
                .controlResponseChannel("aeron:udp?endpoint=127.0.0.1:0"))) {
            System.out.println("READY");
            System.out.flush();
            while (in.readLine() != null) {
                got[0] = 0;
                try (Subscription sub = archive.replay(recordingId, 0, length, args[3], 1101)) {
                    while (sub.imageCount() == 0) idle.idle(0);
                    Image image = sub.imageAtIndex(0);
                    while (image.position() < length) idle.idle(image.blockPoll(handler, 1 << 20));
                }
                System.out.println("DONE " + got[0]);
                System.out.flush();
            }
        }
    }
}
"""


class _JavaReplayer:
    """The Java consumer of :data:`_JAVA_REPLAY` on its own Java media driver; :meth:`run` is
    one whole bounded replay of the recording."""

    def __init__(self, control_channel: str, recording_id: int, end: int, tmp: str) -> None:
        import subprocess

        import aeron_peer

        from aeron_spark.transport.testing import free_udp_port

        classes = aeron_peer.compile_java(_JAVA_REPLAY, "BenchReplay", Path(tmp) / "java")
        self.end = end
        self.driver = aeron_peer.JavaMediaDriver("bench-replay")
        replay_channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        argv = aeron_peer.java_argv(
            "BenchReplay",
            self.driver.client_properties(),
            classpath=[classes],
            args=[control_channel, str(recording_id), str(end), replay_channel],
        )
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._line() != "READY":
            self.close()
            raise RuntimeError("the Java replay consumer did not start")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def run(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        answer = self._line()
        if answer != f"DONE {self.end}":
            raise RuntimeError(f"the Java replay consumer answered {answer!r}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a stuck JVM is killed below
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.driver.close()


def _replay_figures(  # type: ignore[no-untyped-def]
    client,
    control_channel: str,
    rid: int,
    end: int,
    rows: int,
    repeats: int,
    tmp: str,
    java_too: bool,
) -> dict[str, object]:
    """Our bounded replay's MB/s and (``java_too``), taking turns with it, a Java consumer's."""
    import aeron_peer

    from benchmarks._timing import interleaved_best

    sizes: list[int] = []

    def ours() -> None:
        sizes.append(sum(len(b.data) for b in client.replay(rid, 0, end)))

    runs = {"ours": ours}
    java = None
    out: dict[str, object] = {}
    try:
        if java_too:
            java = _JavaReplayer(control_channel, rid, end, tmp)
            runs["java"] = java.run
    except aeron_peer.PeerUnavailable as exc:
        out["replay_java"] = f"not measured: {exc}"
    try:
        best = interleaved_best(runs, repeats)
    finally:
        if java is not None:
            java.close()
    out["replay_bytes"] = sizes[-1]
    out["replay_mb_per_s"] = round(end / best["ours"] / 1e6, 1)
    out["replay_msgs_per_s"] = round(rows // 2 / best["ours"])
    if "java" in best:
        out["replay_java_mb_per_s"] = round(end / best["java"] / 1e6, 1)
        out["replay_to_java_ratio"] = round(best["java"] / best["ours"], 3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-spark", action="store_true", help="replay figures only")
    p.add_argument(
        "--java-replay",
        action="store_true",
        help="also time a Java consumer of the same replay (replay_java_mb_per_s)",
    )
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
                result.update(
                    _replay_figures(
                        client,
                        archive.control_channel,
                        rid,
                        end,
                        args.rows,
                        args.repeats,
                        tmp,
                        args.java_replay,
                    )
                )
                if not args.no_spark:
                    result.update(_spark(archive.control_channel, args.rows, args.repeats, tmp))
        finally:
            driver.close()
    print(json.dumps(result))
    return 0


def _spark(control_channel: str, rows: int, repeats: int, tmp: str) -> dict[str, object]:
    from pyspark.sql import SparkSession

    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.server import ServerConfig, StreamServer
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
    from pyspark.sql import functions as F

    from aeron_spark.transport.testing import free_udp_port
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

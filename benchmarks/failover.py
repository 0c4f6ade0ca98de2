"""Failover across Aeron Archive replicas (issue 30): time from the primary's kill -9 to the
query's next progress.

    python -m benchmarks.failover [--read] [--write] [--rows N] [--rate 1000] [--timeout-ms 5000]
                                  [--repeats 3] [--failover-timeout-ms 5000]

Needs Java and the pinned aeron-all jar (``python transport/tests/aeron_peer.py fetch``). Three
``ArchivingMediaDriver``s run on loopback (``aeron_peer.archive_set``: sleeping idle strategies);
the primary records our live multi-destination publication and the two others replicate it with
a live merge. Prints one JSON object (with the load average at the start):

* ``read``: a ``readStream.format("aeron").option("archive", "<primary>,<second>,<third>")``
  query (``maxMessagesPerTrigger`` 300, 500 ms trigger, ``timeoutMs``) writes to parquet while
  ``--rows`` rows are published at ``--rate`` rows/s; the primary is killed once the query read
  a fifth of them. ``kill_to_next_progress_s``: from the kill to the first micro-batch that
  started after it and read rows (a task reading from the dead archive fails over after a stall
  of ``timeoutMs``; the driver probes it for at most 3 s, then skips it);
  ``kill_to_first_progress_s``: to any progress with rows (a batch in flight may finish first);
  ``rows_out`` / ``duplicates``: the parquet output checked for every row exactly once.

* ``write`` (``--write``; :mod:`benchmarks.failover_write`): the archive sink's rows/s with
  ``minInSyncReplicas`` 1, 2 and 3 in turns, and the time from the primary's kill -9 to the next
  batch committed on a promoted replica (see that module).

``--read`` and ``--write`` choose the parts; with neither, both run. ``--rows`` is per part
(6,000 published rows for the read, 50,000 rows a batch for the write).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))

READ_STREAM = 5301
_WAIT_S = 120.0
# the longest the read part waits for its query to read a fifth of the rows while it keeps
# making progress (a micro-batch within every _WAIT_S): at load 18 on 2 cores its first batches
# took most of a fixed 120 s wait (sized for a quiet machine) and the run failed unmeasured
_READ_CAP_S = 1200.0


def _wait_rows(query: Any, rows: int, writer_failed: list[BaseException]) -> None:
    """Until ``query`` has read ``rows`` rows: bounded by progress (a new micro-batch within
    every :data:`_WAIT_S`, :data:`_READ_CAP_S` in all), not by one wait for a quiet machine;
    a query or writer that failed ends it at once, saying why."""
    began = time.monotonic()
    last_batch, stalled_at = None, began + _WAIT_S
    while (read := _rows_read(query)) < rows:
        now = time.monotonic()
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"the query failed after reading {read} of {rows} rows: {error}")
        if writer_failed:
            raise RuntimeError(f"the writer failed: {writer_failed[0]!r}")
        progress = query.lastProgress
        batch = None if progress is None else progress["batchId"]
        if batch != last_batch:
            last_batch, stalled_at = batch, now + _WAIT_S
        if now > stalled_at or now - began > _READ_CAP_S:
            raise TimeoutError(
                f"reading: {read} of {rows} rows read in {now - began:.0f} s "
                f"(last micro-batch {last_batch}, load {os.getloadavg()[0]:.1f})"
            )
        time.sleep(0.05)


def _replicated_live_stream(archives: dict, driver: Any, stream_id: int) -> tuple[Any, str]:
    """A live multi-destination publication the primary records and the others replicate
    (live merge): (publication, live channel)."""
    import aeron_peer  # type: ignore[import-not-found]

    from aeron_spark.transport.archive.client import (
        ArchiveClient,
        RecordingSignal,
        ReplicationParams,
    )

    primary = archives["primary"].control_channel
    live = f"aeron:udp?control=127.0.0.1:{aeron_peer.free_udp_port()}|control-mode=dynamic"
    with ArchiveClient.connect(primary, driver, timeout_s=60) as client:
        sub_id = client.start_recording(live, stream_id)
        pub = driver.add_publication(live + "|term-length=1048576", stream_id)
        if not pub.wait_until_connected(60):
            raise TimeoutError("the primary did not subscribe")
        rid = client.wait_for_signal(
            lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
        ).recording_id
    pub.offer_blocking(b"first", timeout_s=60)
    for name, archive in archives.items():
        if name == "primary":
            continue
        with ArchiveClient.connect(archive.control_channel, driver, timeout_s=60) as copy:
            replication = copy.replicate(
                rid, primary, params=ReplicationParams(live_destination=live)
            )
            copy.wait_for_replication(replication, RecordingSignal.MERGE)
    return pub, live


def read_failover(spark: Any, root: Path, rows: int, rate: int, timeout_ms: int) -> dict:
    """The read part: a streaming query over three replicas, the primary killed mid-stream."""
    import aeron_peer  # type: ignore[import-not-found]

    from aeron_spark.transport import Driver, DriverConfig

    payloads = [b"row-%07d" % i for i in range(rows)]
    driver = Driver(DriverConfig(directory=root / "driver", write_counters_file=False)).start()
    try:
        with aeron_peer.archive_set(
            root / "archives", [("primary", 0x41A), ("second", 0x41B), ("third", 0x41C)]
        ) as archives:
            pub, _ = _replicated_live_stream(archives, driver, READ_STREAM)

            writer_failed: list[BaseException] = []

            def write() -> None:
                per_tick = max(1, rate // 100)
                try:
                    for i, m in enumerate(payloads):
                        pub.offer_blocking(m, timeout_s=60)
                        if i % per_tick == per_tick - 1:
                            time.sleep(0.01)
                except BaseException as exc:  # reported by the wait for rows, not lost
                    writer_failed.append(exc)
                    raise

            out = root / "out"
            query = (
                spark.readStream.format("aeron")
                .option("archive", ",".join(a.control_channel for a in archives.values()))
                .option("streamId", READ_STREAM)
                .option("timeoutMs", timeout_ms)
                .option("maxMessagesPerTrigger", 300)
                .load()
                .select("value")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(root / "ckpt"))
                .trigger(processingTime="500 milliseconds")
                .start()
            )
            writer = threading.Thread(target=write, name="failover-writer", daemon=True)
            try:
                writer.start()
                _wait_rows(query, rows // 5, writer_failed)
                killed_wall, killed = time.time(), time.monotonic()
                before = _rows_read(query)
                archives["primary"].kill()
                first = next_batch = None
                deadline = time.monotonic() + _WAIT_S
                while next_batch is None and time.monotonic() < deadline:
                    now = time.monotonic()
                    if first is None and _rows_read(query) > before:
                        first = now - killed
                    if any(
                        p["numInputRows"] > 0 and _started(p) >= killed_wall
                        for p in query.recentProgress
                    ):
                        next_batch = now - killed
                    time.sleep(0.05)
                # where the seconds went: each batch around the kill (start relative to the
                # kill, rows, Spark's durations: latestOffset/planning on the driver, addBatch =
                # the tasks)
                batches = [
                    {
                        "started_s": round(_started(p) - killed_wall, 2),
                        "rows": p["numInputRows"],
                        **{k: p["durationMs"].get(k) for k in _DURATIONS},
                    }
                    for p in query.recentProgress
                    if _started(p) >= killed_wall - 5
                    and (next_batch is None or _started(p) <= killed_wall + next_batch)
                ]
                writer.join(_WAIT_S)
                query.processAllAvailable()
                error = query.exception()
            finally:
                query.stop()
                writer.join(_WAIT_S)
            pub.close()
            got = [bytes(r.value) for r in spark.read.parquet(str(out)).collect()]
    finally:
        driver.close()
    wanted = {b"first", *payloads}
    return {
        "rows": rows,
        "rate_rows_per_s": rate,
        "timeout_ms": timeout_ms,
        "killed_at": datetime.fromtimestamp(killed_wall).strftime("%H:%M:%S.%f")[:-3],
        "kill_to_next_progress_s": None if next_batch is None else round(next_batch, 2),
        "kill_to_first_progress_s": None if first is None else round(first, 2),
        "batches_around_the_kill": batches,
        "rows_out": len(got),
        "duplicates": len(got) - len(set(got)),
        "every_row_once": sorted(got) == sorted(wanted),
        "query_error": None if error is None else str(error)[:300],
    }


_DURATIONS = ("latestOffset", "queryPlanning", "addBatch", "triggerExecution")


def _rows_read(query: Any) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def _started(progress: Any) -> float:
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--read", action="store_true", help="the read part (streaming source)")
    parser.add_argument("--write", action="store_true", help="the write part (the sink)")
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help="read: rows published (6000); write: rows a batch (50000)",
    )
    parser.add_argument("--rate", type=int, default=1000, help="rows published per second")
    parser.add_argument("--timeout-ms", type=int, default=5000, help="the read query's timeoutMs")
    parser.add_argument("--repeats", type=int, default=3, help="write: timed runs per contender")
    parser.add_argument(
        "--failover-timeout-ms",
        type=int,
        default=5000,
        help="write: the sink's timeoutMs when the primary is killed",
    )
    args = parser.parse_args(argv)
    # failovers are logged as warnings: timed, to line them up with the kill (killed_at)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s.%(msecs)03d pid %(process)d %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.read and not args.write:
        args.read = args.write = True
    result: dict[str, Any] = {"load_average": list(os.getloadavg())}
    if args.write:
        from benchmarks.failover_write import run_write

        result["write"] = run_write(args.rows or 50_000, args.repeats, args.failover_timeout_ms)
    if args.read:
        from pyspark.sql import SparkSession

        from aeron_spark.connector.datasource import ensure_registered

        spark = (
            SparkSession.builder.master("local[2,4]")
            .appName("benchmark-failover")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        ensure_registered(spark)
        try:
            with tempfile.TemporaryDirectory(prefix="aeron-spark-failover-") as root:
                result["read"] = read_failover(
                    spark, Path(root), args.rows or 6000, args.rate, args.timeout_ms
                )
        finally:
            spark.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Read ticks with format("aeron") (JSON, typed by a schema), aggregate per symbol and minute with a
watermark (append mode: a minute is written once the watermark, the latest tick's time - 10 s,
passes its end), and write the result back through the exactly-once aeron sink.

With a server running (`aeron-spark server --dir /tmp/aeron-data --port 40123`):

    .venv/bin/python examples/market_ticks_producer.py --backfill-minutes 5
    .venv/bin/python examples/market_ticks_job.py --checkpoint /tmp/ticks-ckpt --available-now

The ticks go to stream 30 and the per-minute rows to stream 31 (streams of their own: the README's
tour uses 10 and 20). With --available-now the query processes everything recorded so far, in
micro-batches of at most --max-ticks-per-batch ticks, and stops, printing one JSON line
{"input_rows": N, "written_rows": W, "output_rows": M}: W rows written by this run, M rows on the
output stream in all. Without it, it runs until interrupted.

Append mode writes a minute only once a later micro-batch has moved the watermark past it, so
ticks of the current minute only (the producer without --backfill-minutes) write nothing yet:
the job says so. A message that is not a JSON tick fails the query naming its recording and
position (--bad-records drop skips them, counted in the executor log).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from aeron_spark.connector.datasource import ensure_registered  # noqa: E402

SCHEMA = "symbol string, price double, qty long, ts double"


def _count(spark: SparkSession, endpoint: str, stream_id: int) -> int:
    return (
        spark.read.format("aeron")
        .option("endpoint", endpoint)
        .option("streamId", stream_id)
        .load()
        .count()
    )


def _cause(text: str) -> str:
    """The project's error in Spark's report (``aeron_spark....XError: message``), else its
    first line."""
    found = re.findall(r"^(aeron_spark\.[\w.]+: .*)$", text, re.M)
    return found[-1] if found else text.strip().splitlines()[0]


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default %(default)s)")
    p.add_argument(
        "--endpoint", default="127.0.0.1:40123", help="stream server (default %(default)s)"
    )
    p.add_argument("--in-stream-id", type=int, default=30, help="ticks (default %(default)s)")
    p.add_argument(
        "--out-stream-id", type=int, default=31, help="per-minute rows (default %(default)s)"
    )
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument(
        "--available-now", action="store_true", help="process what is recorded, then stop"
    )
    p.add_argument(
        "--max-ticks-per-batch",
        type=int,
        default=5000,
        help="ticks per micro-batch (default %(default)s): later batches write the minutes "
        "earlier ones closed",
    )
    p.add_argument(
        "--bad-records",
        choices=("fail", "drop"),
        default="fail",
        help="a message that is not a JSON tick fails the query (default) or is dropped",
    )
    args = p.parse_args()
    spark = (
        SparkSession.builder.master(args.master)
        .appName("market-ticks")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    ensure_registered(spark)
    before = _count(spark, args.endpoint, args.out_stream_id)
    ticks = (
        spark.readStream.format("aeron")
        .option("endpoint", args.endpoint)
        .option("streamId", args.in_stream_id)
        .option("format", "json")
        .option("schema", SCHEMA)
        .option("badRecordsPolicy", args.bad_records)
        .option("maxMessagesPerTrigger", args.max_ticks_per_batch)
        .load()
        .withColumn("event_time", F.col("ts").cast("timestamp"))
    )
    per_minute = (
        ticks.withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "1 minute"), "symbol")
        .agg(
            F.count("*").alias("ticks"),
            F.sum("qty").alias("volume"),
            F.round(F.avg("price"), 4).alias("avg_price"),
        )
    )
    out = per_minute.select(
        F.to_json(
            F.struct(
                F.col("window.start").cast("string").alias("minute"),
                "symbol",
                "ticks",
                "volume",
                "avg_price",
            )
        )
        .cast("binary")
        .alias("value")
    )
    writer = (
        out.writeStream.outputMode("append")
        .format("aeron")
        .option("endpoint", args.endpoint)
        .option("streamId", args.out_stream_id)
        .option("sinkId", f"market-ticks-{args.out_stream_id}")
        .option("checkpointLocation", args.checkpoint)
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - the query's failure, said in one line
        print(f"query failed: {_cause(str(exc))}", file=sys.stderr)
        spark.stop()
        return 1
    input_rows = sum(p.get("numInputRows", 0) for p in query.recentProgress)
    after = _count(spark, args.endpoint, args.out_stream_id)
    if after == before:
        print(
            "nothing written: append mode writes a minute once the watermark (the latest tick's "
            "time - 10 s) has passed its end in an earlier micro-batch; publish ticks spanning "
            "several minutes (market_ticks_producer.py --backfill-minutes 5) or run the job "
            "again later",
            file=sys.stderr,
        )
    print(
        json.dumps({"input_rows": input_rows, "written_rows": after - before, "output_rows": after})
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

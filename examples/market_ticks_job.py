"""Read ticks with format("aeron"), aggregate per symbol and minute with a watermark (append
mode: a window is written once the watermark passes it), and write the result back through
the exactly-once aeron sink.

    python examples/market_ticks_job.py --master local[2] --endpoint 127.0.0.1:40123 \
        --in-stream-id 10 --out-stream-id 20 --checkpoint /tmp/ticks-ckpt [--available-now]

With --available-now the query processes everything recorded so far and stops, printing one JSON
line {"input_rows": N, "output_rows": M}; without it, it runs until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from aeron_spark.connector.datasource import ensure_registered  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

SCHEMA = "symbol string, price double, qty long, ts double"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--master", default="local[2]")
    p.add_argument("--endpoint", default="127.0.0.1:40123")
    p.add_argument("--in-stream-id", type=int, default=10)
    p.add_argument("--out-stream-id", type=int, default=20)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--available-now", action="store_true")
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
    ticks = (
        spark.readStream.format("aeron")
        .option("endpoint", args.endpoint)
        .option("streamId", args.in_stream_id)
        .load()
    )
    parsed = (
        ticks.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("t"))
        .select("t.*")
        .withColumn("event_time", F.col("ts").cast("timestamp"))
    )
    per_minute = (
        parsed.withWatermark("event_time", "10 seconds")
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
    query.awaitTermination()
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 1
    input_rows = sum(p.get("numInputRows", 0) for p in query.recentProgress)
    back = (
        spark.read.format("aeron")
        .option("endpoint", args.endpoint)
        .option("streamId", args.out_stream_id)
        .load()
    )
    print(json.dumps({"input_rows": input_rows, "output_rows": back.count()}))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

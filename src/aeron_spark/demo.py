"""The quickstart (``aeron-spark demo``): embedded server, a producer, and a local Spark query.

1. starts a stream server in a temporary directory on 127.0.0.1 (a free port);
2. publishes market ticks (JSON, one message each) from several producer sessions, so the stream
   has several recordings (Spark partitions);
3. runs a Structured Streaming query on ``local[2]``: ``readStream.format("aeron")``, parse, and a
   per-symbol aggregate, with ``Trigger.AvailableNow`` into a memory table;
4. writes the aggregate back through the exactly-once sink (``write.format("aeron")``) and reads
   it back with a bounded batch read;
5. prints both tables and checks that every published tick was counted exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence

SYMBOLS = ("AAPL", "MSFT", "NVDA", "AMZN", "GOOG")


def make_ticks(producer: int, count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed * 1000 + producer)
    base = time.time()
    out = []
    for i in range(count):
        symbol = rng.choice(SYMBOLS)
        out.append(
            json.dumps(
                {
                    "symbol": symbol,
                    "price": round(100 + rng.random() * 50, 2),
                    "qty": rng.randint(1, 500),
                    "producer": producer,
                    "seq": i,
                    "ts": base + i * 0.001,
                }
            ).encode()
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aeron-spark demo",
        description=(
            "Quickstart: embedded stream server + producers + a local Spark streaming query."
        ),
    )
    parser.add_argument(
        "--producers", type=int, default=3, help="publishing sessions (default %(default)s)"
    )
    parser.add_argument(
        "--ticks", type=int, default=20_000, help="ticks per producer (default %(default)s)"
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default %(default)s)")
    parser.add_argument("--dir", default=None, help="server directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.producers < 1 or args.ticks < 1:
        parser.error("--producers and --ticks must be at least 1")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server import ServerConfig, StreamServer

    with tempfile.TemporaryDirectory(prefix="aeron-spark-demo-") as tmp:
        directory = args.dir or os.path.join(tmp, "server")
        print(f"[1/5] starting a stream server in {directory}")
        with StreamServer(ServerConfig(directory=directory, host="127.0.0.1", port=0)) as server:
            endpoint = server.endpoint
            print(f"      listening on {endpoint}")

            print(f"[2/5] publishing {args.producers} x {args.ticks:,} ticks into stream 10")
            started = time.monotonic()
            for producer in range(args.producers):
                with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
                    client.publish(10, make_ticks(producer, args.ticks, args.seed))
            published = args.producers * args.ticks
            print(f"      {published:,} messages in {time.monotonic() - started:.1f} s")

            print(f"[3/5] starting Spark ({args.master}) and running the streaming query")
            from pyspark.sql import SparkSession
            from pyspark.sql import functions as F

            spark = (
                SparkSession.builder.master(args.master)
                .appName("aeron-spark-demo")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "4")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            from aeron_spark.connector.datasource import ensure_registered

            ensure_registered(spark)
            try:
                ticks = (
                    spark.readStream.format("aeron")
                    .option("endpoint", endpoint)
                    .option("streamId", 10)
                    .option("startingPositions", "earliest")
                    .load()
                )
                schema = "symbol string, price double, qty long, producer int, seq long, ts double"
                parsed = ticks.select(
                    F.from_json(F.col("value").cast("string"), schema).alias("t"),
                    "recording_id",
                    "position",
                )
                summary = parsed.groupBy("t.symbol").agg(
                    F.count("*").alias("ticks"),
                    F.round(F.avg("t.price"), 2).alias("avg_price"),
                    F.sum("t.qty").alias("volume"),
                )
                checkpoint = os.path.join(tmp, "checkpoint")
                query = (
                    summary.writeStream.outputMode("complete")
                    .format("memory")
                    .queryName("ticks_by_symbol")
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination(600)
                if query.exception() is not None:
                    raise RuntimeError(f"streaming query failed: {query.exception()}")
                result = spark.sql("SELECT * FROM ticks_by_symbol ORDER BY symbol")
                result.show(truncate=False)
                counted = sum(row["ticks"] for row in result.collect())

                print("[4/5] writing the summary back through the exactly-once sink (stream 20)")
                (
                    result.withColumn(
                        "value",
                        F.to_json(F.struct("symbol", "ticks", "avg_price", "volume")).cast(
                            "binary"
                        ),
                    )
                    .select("value")
                    .write.format("aeron")
                    .option("endpoint", endpoint)
                    .option("streamId", 20)
                    .option("sinkId", "demo-summary")
                    .mode("append")
                    .save()
                )

                print("[5/5] reading stream 20 back with a batch read")
                back = (
                    spark.read.format("aeron")
                    .option("endpoint", endpoint)
                    .option("streamId", 20)
                    .load()
                    .select(F.col("value").cast("string").alias("value"), "position")
                )
                back.show(truncate=False)
                written_back = back.count()
            finally:
                spark.stop()

    ok = counted == published and written_back == len(SYMBOLS)
    print(
        json.dumps(
            {
                "published": published,
                "counted_once": counted,
                "summary_rows_written_back": written_back,
                "ok": ok,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

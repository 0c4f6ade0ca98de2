"""Exactly once, source -> transformation -> sink, through a simulated crash.

    .venv/bin/python examples/exactly_once_roundtrip.py

An embedded stream server holds a stream of orders. A streaming query reads it with
``format("aeron")`` (at most ``--per-batch`` messages per micro-batch), keeps the large orders,
reformats them, and writes them back to another stream with the aeron sink (``sinkId``).

Then it simulates the nastiest crash for a sink: the driver dies after the sink committed the last
micro-batch but before Spark recorded that in its checkpoint (we delete the checkpoint's last
``commits/N`` file). On restart Spark runs that batch again; the server sees the same
(sinkId, batch) and appends nothing new. Prints one JSON line, e.g.
{"orders": 20000, "expected": 10000, "written": 10000, "distinct": 10000, "batches": 4,
 "rerun_batch": 3, "rerun_input_rows": 2000, "exactly_once": true}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--orders", type=int, default=20_000)
    p.add_argument("--per-batch", type=int, default=6_000)
    args = p.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.server import ServerConfig, StreamServer

    with (
        tempfile.TemporaryDirectory() as tmp,
        StreamServer(ServerConfig(directory=os.path.join(tmp, "server"), port=0)).start() as server,
    ):
        orders = [f"order-{i:06d},{i % 2 * 900 + 50}".encode() for i in range(args.orders)]
        with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
            client.publish(1, orders)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("exactly-once-roundtrip")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        ensure_registered(spark)
        checkpoint = os.path.join(tmp, "checkpoint")

        def run() -> int:
            source = (
                spark.readStream.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 1)
                .option("maxMessagesPerTrigger", args.per_batch)
                .load()
            )
            fields = F.split(F.col("value").cast("string"), ",")
            big = (
                source.select(fields[0].alias("id"), fields[1].cast("int").alias("amount"))
                .where("amount > 500")
                .select(F.concat_ws(":", F.upper("id"), "amount").cast("binary").alias("value"))
            )
            query = (
                big.writeStream.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 2)
                .option("sinkId", "big-orders")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            return len(progress), sum(p["numInputRows"] for p in progress)

        try:
            batches, _ = run()
            commits = sorted(
                int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit()
            )
            last = commits[-1]
            for name in (str(last), f".{last}.crc"):  # the simulated crash
                path = os.path.join(checkpoint, "commits", name)
                if os.path.exists(path):
                    os.remove(path)
            _, rerun_rows = run()  # Spark runs batch `last` again; the sink's commit is idempotent
            written = [
                bytes(r.value)
                for r in spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 2)
                .load()
                .collect()
            ]
        finally:
            spark.stop()
    expected = sum(1 for o in orders if int(o.split(b",")[1]) > 500)
    result = {
        "orders": len(orders),
        "expected": expected,
        "written": len(written),
        "distinct": len(set(written)),
        "batches": batches,
        "rerun_batch": last,
        "rerun_input_rows": rerun_rows,
        "exactly_once": len(written) == len(set(written)) == expected and rerun_rows > 0,
    }
    print(json.dumps(result))
    return 0 if result["exactly_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

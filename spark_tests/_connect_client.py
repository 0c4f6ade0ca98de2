"""A Spark Connect client, run as its own process by ``test_spark_connect.py``.

``python _connect_client.py sc://HOST:PORT`` opens ``SparkSession.builder.remote(URL)``, prints
``READY``, then runs one scenario against the aeron source and sink per line of standard input
(``{"id": N, "scenario": NAME, "args": {...}}``), answering each with one line, ``REPLY:`` and
``{"id": N, "result": ...}`` or ``{"id": N, "error": TRACEBACK}``; it stops the session at the
end of its input. One session for the module: each new Connect session starts its own Python
workers on the server.
It runs apart from the test process because a Connect session cannot share a process with the
suite's classic SparkSession (``remote()`` refuses to start where a SparkContext is active, and it
switches the whole process's ``pyspark.sql`` functions to Connect), and because this is what a
user runs: a plain script, whose ``foreachBatch`` function is pickled and run by the server's
Python.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

COLUMNS = ("value", "stream_id", "session_id", "recording_id", "position", "reserved_value")


def rows_of(df) -> list[list[Any]]:  # type: ignore[no-untyped-def]
    """Rows as JSON: the value as hex, the other columns as they are."""
    return [
        [bytes(r.value).hex(), *(r[c] for c in COLUMNS[1:])] for r in df.select(*COLUMNS).collect()
    ]


def batch_read(spark, a: dict) -> dict:  # type: ignore[no-untyped-def]
    df = spark.read.format("aeron").option("endpoint", a["endpoint"])
    df = df.option("streamId", a["stream_id"]).load()
    start, end = a["range"]
    part = (
        spark.read.format("aeron")
        .option("endpoint", a["endpoint"])
        .option("streamId", a["stream_id"])
        .option("startingPositions", json.dumps({str(a["recording_id"]): start}))
        .option("endingPositions", json.dumps({str(a["recording_id"]): end}))
        .load()
    )
    return {"schema": df.schema.simpleString(), "rows": rows_of(df), "range": rows_of(part)}


def streaming_read(spark, a: dict) -> dict:  # type: ignore[no-untyped-def]
    """One AvailableNow run into parquet (the checkpoint carries over between runs) and, when
    ``table`` names one, one into the memory sink, read back in this session."""
    src = (
        spark.readStream.format("aeron")
        .option("endpoint", a["endpoint"])
        .option("streamId", a["stream_id"])
        .load()
    )
    query = (
        src.select(*COLUMNS)
        .writeStream.format("parquet")
        .option("path", a["out"])
        .option("checkpointLocation", a["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240), "the parquet query did not finish"
    assert query.exception() is None, query.exception()
    if a["table"] is None:
        return {}
    memory = (
        src.writeStream.format("memory")
        .queryName(a["table"])
        .option("checkpointLocation", a["checkpoint"] + "-memory")
        .trigger(availableNow=True)
        .start()
    )
    assert memory.awaitTermination(240), "the memory query did not finish"
    assert memory.exception() is None, memory.exception()
    return {"memory": rows_of(spark.sql(f"SELECT * FROM {a['table']}"))}


def batch_write(spark, a: dict) -> dict:  # type: ignore[no-untyped-def]
    rows = [(bytes.fromhex(v), r) for v, r in a["rows"]]
    df = spark.createDataFrame(rows, "value binary, reserved_value long").repartition(3)
    (
        df.write.format("aeron")
        .option("endpoint", a["endpoint"])
        .option("streamId", a["stream_id"])
        .option("sinkId", a["sink_id"])
        .mode("append")
        .save()
    )
    return {}


def streaming_write(spark, a: dict) -> dict:  # type: ignore[no-untyped-def]
    src = (
        spark.readStream.format("aeron")
        .option("endpoint", a["endpoint"])
        .option("streamId", a["stream_in"])
        .option("maxMessagesPerTrigger", a["max_per_trigger"])
        .load()
    )
    query = (
        src.select(F.concat(F.col("value"), F.lit(b"!")).alias("value"), "position")
        .withColumnRenamed("position", "reserved_value")
        .writeStream.format("aeron")
        .option("endpoint", a["endpoint"])
        .option("streamId", a["stream_out"])
        .option("sinkId", a["sink_id"])
        .option("checkpointLocation", a["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240), "the query did not finish"
    assert query.exception() is None, query.exception()
    return {"batches": [p.batchId for p in query.recentProgress if p.numInputRows > 0]}


def foreach_batch(spark, a: dict) -> dict:  # type: ignore[no-untyped-def]
    endpoint, stream_out, out = a["endpoint"], a["stream_out"], a["out"]

    # Runs in the Connect server's Python, with a Connect session of its own (df.sparkSession):
    # only plain values may be captured here.
    def each(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        df.select(*COLUMNS).withColumn("batch_id", F.lit(batch_id)).write.mode("append").parquet(
            out
        )
        (
            df.select(F.upper(F.col("value").cast("string")).cast("binary").alias("value"))
            .write.format("aeron")
            .option("endpoint", endpoint)
            .option("streamId", stream_out)
            .mode("append")
            .save()
        )

    query = (
        spark.readStream.format("aeron")
        .option("endpoint", endpoint)
        .option("streamId", a["stream_in"])
        .option("maxMessagesPerTrigger", a["max_per_trigger"])
        .load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", a["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240), "the query did not finish"
    assert query.exception() is None, query.exception()
    return {}


SCENARIOS = {
    f.__name__: f for f in (batch_read, streaming_read, batch_write, streaming_write, foreach_batch)
}


def main() -> None:
    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    try:
        # A regular install needs nothing: the server's Python finds `pyspark_aeron` itself (what
        # CI runs). An editable one is invisible to that discovery: register it from here.
        from aeron_spark.connector.datasource import ensure_registered

        ensure_registered(spark)
        print("READY", flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            reply = {"id": request["id"]}
            try:
                reply["result"] = SCENARIOS[request["scenario"]](spark, request["args"])
            except Exception:
                reply["error"] = traceback.format_exc()
            print("REPLY:" + json.dumps(reply), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()

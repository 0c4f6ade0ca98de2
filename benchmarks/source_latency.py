"""End-to-end latency of the aeron source: publish -> row reaching a sink, against Spark's own
micro-batch overhead. Used by ``python -m benchmarks.source`` (keys ``latency_p50_ms``,
``empty_batch_ms``, ``latency_p50_to_empty_batch_ratio``).

* Latency: a streaming query (trigger as fast as possible) reads a stream with
  ``format("aeron")`` into a trivial Python sink that, in each task, stamps every row's arrival
  (``time.time_ns()``) against the publish time the producer put in the message, and appends the
  differences to a file. The producer publishes one message every ``interval_s``.
* Empty micro-batch: a query over ``rate-micro-batch`` with one row per batch into ``noop``,
  triggered as fast as possible; the median ``triggerExecution`` duration of its batches is what
  Spark costs per micro-batch with (next to) nothing to do. For context,
  ``python_source_empty_batch_ms`` is the same for a trivial Python streaming source (one row per
  batch from memory): the floor any Python data source starts from.
"""

from __future__ import annotations

import os
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)

_STAMP = struct.Struct("<q")


class _Done(WriterCommitMessage):
    pass


class _StampWriter(DataSourceStreamWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[Any]) -> _Done:
        now = time.time_ns()
        lines = []
        for row in iterator:
            value = row["value"] if "value" in row.__fields__ else None
            if isinstance(value, (bytes, bytearray)) and value[8:9] == b"M":  # measured ones
                lines.append(str((now - _STAMP.unpack_from(value)[0]) / 1e6))
        if lines:
            with open(self.path, "a") as fh:
                fh.write("\n".join(lines) + "\n")
        return _Done()

    def commit(self, messages: list, batchId: int) -> None:
        pass

    def abort(self, messages: list, batchId: int) -> None:
        pass


class StampSink(DataSource):
    """``format("latencystamp")``: appends (now - stamp) in ms per row's ``value`` to ``path``."""

    @classmethod
    def name(cls) -> str:
        return "latencystamp"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return _StampWriter(self.options["path"])


class _TickReader(DataSourceStreamReader):
    """One row per micro-batch, from memory: the floor of a Python streaming source."""

    def initialOffset(self) -> dict:
        return {"n": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        n = (start or {"n": 0})["n"]
        return {"n": n + 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(end["n"])]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        yield (_STAMP.pack(time.time_ns()),)


class TickSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pythontick"

    def schema(self) -> str:
        return "value binary"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _TickReader()


def _median_trigger_ms(spark: Any, df: Any, checkpoint: str, seconds: float) -> tuple[float, int]:
    query = (
        df.writeStream.format("noop").option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds").start()
    )
    time.sleep(seconds)
    progress = list(query.recentProgress)
    query.stop()
    durations = [p["durationMs"]["triggerExecution"] for p in progress[3:]]
    return (round(statistics.median(durations), 1) if durations else 0.0), len(durations)


def measure(spark: Any, endpoint: str, messages: int = 60, interval_s: float = 0.1) -> dict:
    from aeron_spark.connector.client import ClientSettings, StreamClient

    spark.dataSource.register(StampSink)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stamps = os.path.join(tmp, "latency.txt")
        with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
            client.publish(77, [_STAMP.pack(time.time_ns()) + b"warm-up"])
        query = (
            spark.readStream.format("aeron").option("endpoint", endpoint).option("streamId", 77)
            .option("startingPositions", "latest").load().select("value")
            .writeStream.format("latencystamp").option("path", stamps)
            .option("checkpointLocation", os.path.join(tmp, "ckpt-latency"))
            .trigger(processingTime="0 seconds").start()
        )
        stop = threading.Event()

        def produce() -> None:
            with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
                # Warm-up messages (not measured) until the query's Python workers are running.
                for _ in range(int(5.0 / interval_s)):
                    client.publish(77, [_STAMP.pack(time.time_ns()) + b"W" + bytes(107)])
                    time.sleep(interval_s)
                for _ in range(messages):
                    if stop.is_set():
                        return
                    client.publish(77, [_STAMP.pack(time.time_ns()) + b"M" + bytes(107)])
                    time.sleep(interval_s)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        deadline = time.monotonic() + 5.0 + messages * interval_s + 60
        values: list[float] = []
        while time.monotonic() < deadline:
            if os.path.exists(stamps):
                with open(stamps) as fh:
                    values = [float(line) for line in fh if line.strip()]
                if len(values) >= messages:
                    break
            time.sleep(0.2)
        stop.set()
        busy = [p["durationMs"] for p in query.recentProgress if p["numInputRows"]]
        query.stop()
        producer.join(5)
        if busy:
            keys = sorted({k for d in busy for k in d})
            out["aeron_batch_ms_p50"] = {
                k: round(statistics.median(d.get(k, 0) for d in busy), 1) for k in keys
            }
        out["latency_samples"] = len(values)
        out["latency_p50_ms"] = round(statistics.median(values), 1) if values else None
        out["latency_p90_ms"] = (
            round(sorted(values)[int(len(values) * 0.9)], 1) if values else None
        )

        seconds = 3.0 + messages * interval_s / 2
        rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
        out["empty_batch_ms"], out["empty_batches"] = _median_trigger_ms(
            spark, rate, os.path.join(tmp, "ckpt-empty"), seconds
        )
        spark.dataSource.register(TickSource)
        tick = spark.readStream.format("pythontick").load()
        out["python_source_empty_batch_ms"], _ = _median_trigger_ms(
            spark, tick, os.path.join(tmp, "ckpt-tick"), seconds
        )
    if out["latency_p50_ms"] is not None and out["empty_batch_ms"]:
        out["latency_p50_to_empty_batch_ratio"] = round(
            out["latency_p50_ms"] / out["empty_batch_ms"], 2
        )
    else:
        out["latency_p50_to_empty_batch_ratio"] = None
    return out


__all__ = ["StampSink", "measure"]

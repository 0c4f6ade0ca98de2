"""End-to-end latency of the aeron source: publish -> row reaching a sink, against Spark's own
micro-batch overhead. Used by ``python -m benchmarks.source`` (keys ``latency_p50_ms``,
``empty_batch_ms``, ``latency_p50_to_empty_batch_ratio``).

* Latency: a streaming query (trigger as fast as possible) reads a stream with
  ``format("aeron")`` and ``readOn=driver`` (the low-latency setting: no Python worker per
  micro-batch); ``executors_latency_p50_ms`` is the same with the default ``readOn=executors``.
  The producer writes its wall-clock time (ns, as 20 ASCII digits) into each message, one
  message every ``interval_s``; the query adds the time each row is processed in the sink's
  task with ``reflect('java.lang.System', 'currentTimeMillis')``, which Spark evaluates per row
  (it is non-deterministic), and gathers
  the differences with ``observe`` (ms resolution) into a ``noop`` sink. A JVM sink keeps a
  Python sink's own per-batch cost out of the figure; ``python_sink_latency_p50_ms`` is the same
  measured with a trivial Python sink stamping each row as it arrives in ``write``.
* Empty micro-batch: a query over ``rate-micro-batch`` with one row per batch into ``noop``,
  triggered as fast as possible; the median ``triggerExecution`` duration of its batches is what
  Spark costs per micro-batch with (next to) nothing to do. For context,
  ``python_source_empty_batch_ms`` is the same for a trivial Python streaming source (one row per
  batch from memory): the floor any Python data source starts from, and
  ``aeron_source_batch_ms`` the same for the aeron source (``readOn=driver``) fed a message every
  50 ms, ``aeron_executors_source_batch_ms`` with ``readOn=executors``.
"""

from __future__ import annotations

import os
import statistics
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


class _Done(WriterCommitMessage):
    pass


class _StampWriter(DataSourceStreamWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[Any]) -> _Done:
        lines = []
        for row in iterator:  # rows arrive as the source produces them: stamp each on arrival
            value = row["value"] if "value" in row.__fields__ else None
            if isinstance(value, (bytes, bytearray)) and value[20:21] == b"M":  # measured ones
                lines.append(str((time.time_ns() - int(value[:20])) / 1e6))
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
        yield (_stamp(b"T"),)


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
        df.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    time.sleep(seconds)
    progress = [p for p in list(query.recentProgress)[3:] if p["numInputRows"]]
    query.stop()
    durations = [p["durationMs"]["triggerExecution"] for p in progress]
    return (round(statistics.median(durations), 1) if durations else 0.0), len(durations)


def _stamp(kind: bytes) -> bytes:
    """116 bytes: the wall-clock time in ns as 20 ASCII digits, then a kind byte (W or M)."""
    return b"%020d" % time.time_ns() + kind + bytes(95)


def jvm_stamped_query(df: Any, checkpoint: str) -> Any:
    """A query over ``df`` (messages stamped as :func:`_stamp` does) into ``noop``, triggered as
    fast as possible, that stamps each row in the sink's task (the JVM's clock, ms) and gathers
    publish -> row latencies of the measured messages with ``observe``: read them with
    :func:`observed_latencies`."""
    from pyspark.sql import functions as F  # noqa: N812

    rows = df.selectExpr(
        "cast(substring(cast(value as string), 1, 20) as bigint) as sent_ns",
        "substring(cast(value as string), 21, 1) as kind",
        "cast(reflect('java.lang.System', 'currentTimeMillis') as bigint) as now_ms",
    )
    latency = F.expr("collect_list(if(kind = 'M', now_ms - sent_ns / 1e6, null))")
    return (
        rows.observe("latency", latency.alias("ms"))
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )


def observed_latencies(query: Any) -> list[float]:
    """The latencies (ms) a :func:`jvm_stamped_query` gathered so far."""
    values: list[float] = []
    for progress in query.recentProgress:
        observed = progress["observedMetrics"].get("latency")
        if observed is not None:
            values.extend(float(v) for v in observed["ms"])
    return values


def _latencies(
    spark: Any,
    endpoint: str,
    stream_id: int,
    start_query: Any,
    collect: Any,
    messages: int,
    interval_s: float,
) -> tuple[list[float], list[dict]]:
    """Publish warm-up then ``messages`` stamped messages to a query started by ``start_query``;
    ``collect()`` returns the latencies seen so far. Returns them and the busy batch timings."""
    from aeron_spark.connector.client import ClientSettings, StreamClient

    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(stream_id, [_stamp(b"W")])
    query = start_query()
    stop = threading.Event()

    def produce() -> None:
        with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
            for _ in range(int(5.0 / interval_s)):  # warm-up (not measured): workers start
                client.publish(stream_id, [_stamp(b"W")])
                time.sleep(interval_s)
            for _ in range(messages):
                if stop.is_set():
                    return
                client.publish(stream_id, [_stamp(b"M")])
                time.sleep(interval_s)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    deadline = time.monotonic() + 5.0 + messages * interval_s + 60
    # collect only once everything is published: polling (a Spark job for the memory sink) while
    # measuring would take the CPU the query needs
    producer.join(max(0.0, deadline - time.monotonic()))
    values: list[float] = collect()
    while time.monotonic() < deadline and len(values) < messages:
        time.sleep(0.5)
        values = collect()
    stop.set()
    busy = [p["durationMs"] for p in query.recentProgress if p["numInputRows"]]
    query.stop()
    producer.join(5)
    return values, busy


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def measure(spark: Any, endpoint: str, messages: int = 60, interval_s: float = 0.1) -> dict:
    spark.dataSource.register(StampSink)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:

        def source(stream_id: int, read_on: str = "driver") -> Any:
            return (
                spark.readStream.format("aeron")
                .option("endpoint", endpoint)
                .option("streamId", stream_id)
                .option("startingPositions", "latest")
                .option("readOn", read_on)
                .load()
            )

        holder: dict[str, Any] = {}

        def jvm_sink(stream: int, read_on: str) -> Any:
            checkpoint = os.path.join(tmp, f"ckpt-jvm-{read_on}")
            holder["query"] = jvm_stamped_query(source(stream, read_on), checkpoint)
            return holder["query"]

        def jvm_collect() -> list[float]:
            return observed_latencies(holder["query"])

        values, _ = _latencies(
            spark,
            endpoint,
            80,
            lambda: jvm_sink(80, "executors"),
            jvm_collect,
            messages,
            interval_s,
        )
        out["executors_latency_p50_ms"] = _p50(values)
        values, busy = _latencies(
            spark, endpoint, 78, lambda: jvm_sink(78, "driver"), jvm_collect, messages, interval_s
        )
        if busy:
            keys = sorted({k for d in busy for k in d})
            out["aeron_batch_ms_p50"] = {
                k: round(statistics.median(d.get(k, 0) for d in busy), 1) for k in keys
            }
        out["latency_samples"] = len(values)
        out["latency_p50_ms"] = _p50(values)
        out["latency_p90_ms"] = round(sorted(values)[int(len(values) * 0.9)], 1) if values else None

        stamps = os.path.join(tmp, "latency.txt")

        def python_sink() -> Any:
            return (
                source(77)
                .select("value")
                .writeStream.format("latencystamp")
                .option("path", stamps)
                .option("checkpointLocation", os.path.join(tmp, "ckpt-py"))
                .trigger(processingTime="0 seconds")
                .start()
            )

        def python_collect() -> list[float]:
            if not os.path.exists(stamps):
                return []
            with open(stamps) as fh:
                return [float(line) for line in fh if line.strip()]

        values, _ = _latencies(
            spark, endpoint, 77, python_sink, python_collect, messages, interval_s
        )
        out["python_sink_latency_p50_ms"] = _p50(values)

        seconds = 3.0 + messages * interval_s / 2
        rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
        out["empty_batch_ms"], out["empty_batches"] = _median_trigger_ms(
            spark, rate, os.path.join(tmp, "ckpt-empty"), seconds
        )
        # the aeron source into noop, fed a message every 50 ms: its cost per micro-batch with
        # data, next to the trivial Python source's below (the floor of any Python source)
        from aeron_spark.connector.client import ClientSettings, StreamClient

        feeding = threading.Event()

        def feed() -> None:
            with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
                while not feeding.is_set():
                    client.publish(79, [_stamp(b"W")])
                    time.sleep(0.05)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        out["aeron_source_batch_ms"], _ = _median_trigger_ms(
            spark, source(79), os.path.join(tmp, "ckpt-aeron-noop"), seconds
        )
        out["aeron_executors_source_batch_ms"], _ = _median_trigger_ms(
            spark, source(79, "executors"), os.path.join(tmp, "ckpt-aeron-exec-noop"), seconds
        )
        feeding.set()
        feeder.join(5)
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

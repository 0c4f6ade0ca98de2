"""Rows/s of the aeron source into a ``noop`` sink on local[2], side by side in one run with
(a) a trivial Python data source yielding the same rows from memory as Arrow batches (the ceiling
of Spark's Python path) and (b) Spark's built-in rate source (``rate-micro-batch``).

    python -m benchmarks.source [--rows 1000000] [--tail 1000] [--tail-only]

The pushed-filter case (``tail_*``, run first; alone with ``--tail-only``) reads the last
``--tail`` rows of a ``--rows``-row recording three ways: ``filter(position >= X)`` pushed down
(``spark.sql.python.filterPushdown.enabled``), ``startingPositions`` at X, and the same filter
with pushdown off (every row read, Spark filters).

Prints one JSON object. Each figure is the best of ``--repeats`` timed runs after a warm-up run;
the contenders take turns (one run each per round), so a slow spell of the machine hits all.
The arrow figure reads the same rows published as Arrow IPC messages of about 60 KiB each.

The ``sbe`` contender reads 103-byte SBE messages (``benchmarks/sbe_message.py``: 15 fields) as
typed columns (``format=sbe``); ``sbe_arrow`` reads the same rows, the same 15 columns, published
as Arrow IPC messages (``format=arrow``): ``sbe_to_arrow_ratio`` is sbe / sbe_arrow.

Every run counts what the query read -- Spark's own count of the rows that reached the sink (an
``Observation`` on the batch reads, the progress ``numInputRows`` summed over the micro-batches of
the rate query) -- and the benchmark fails (exit status 2, the contender and both counts on
stderr) when it differs from the rows published: a figure for rows that were not read is no
figure. ``rows_read`` in the output is the count every contender read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
from pyspark.sql import Observation, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402

from aeron_spark.connector.formats import BINARY_SCHEMA_DDL, arrow_schema  # noqa: E402
from benchmarks._timing import ceiling_ratios, interleaved_best  # noqa: E402

MESSAGE_LENGTH = 116


class RowsMismatch(RuntimeError):
    """A contender's query read a different number of rows than were published."""


def _noop(df) -> int:  # type: ignore[no-untyped-def]
    """Write ``df`` to the ``noop`` sink; the rows Spark counted on the way (what was read)."""
    observed = Observation()
    (
        df.observe(observed, F.count(F.lit(1)).alias("rows"))
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return int(observed.get["rows"])


def counted(name: str, run, expected: int, read: dict[str, int]):  # type: ignore[no-untyped-def]
    """``run`` (which returns the rows its query read) checked against ``expected``."""

    def checked() -> None:
        got = run()
        read[name] = got
        if got != expected:
            raise RowsMismatch(
                f"benchmark contender {name!r} read {got} rows, but {expected} were published"
            )

    return checked


class _Slice(InputPartition):
    def __init__(self, index: int, rows: int) -> None:
        self.index = index
        self.rows = rows


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int) -> None:
        self.rows = rows
        self.parts = partitions

    def partitions(self):  # type: ignore[no-untyped-def]
        per = self.rows // self.parts
        return [_Slice(i, per) for i in range(self.parts)]

    def read(self, partition):  # type: ignore[no-untyped-def]
        batch_rows = 65536
        schema = arrow_schema(False)
        value = pa.array([bytes(MESSAGE_LENGTH)] * batch_rows, pa.binary())
        ints = pa.array([1] * batch_rows, pa.int32())
        longs = pa.array(range(batch_rows), pa.int64())
        ts = pa.array([0] * batch_rows, pa.timestamp("us", tz="UTC"))
        full = pa.RecordBatch.from_arrays(
            [value, ints, ints, longs, longs, ts, longs], schema=schema
        )
        left = partition.rows
        while left > 0:
            n = min(left, batch_rows)
            yield full.slice(0, n)
            left -= n


class CeilingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ceiling"

    def schema(self) -> str:
        return BINARY_SCHEMA_DDL

    def reader(self, schema):  # type: ignore[no-untyped-def]
        return CeilingReader(int(self.options["rows"]), int(self.options.get("partitions", "2")))


def _tail_case(spark, endpoint: str, rows: int, tail: int, repeats: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The last ``tail`` rows of a ``rows``-row recording (stream 14): by a pushed
    ``position >=`` filter, by ``startingPositions``, and by the same filter not pushed."""
    from aeron_spark.connector.client import ClientSettings, StreamClient

    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(14, (bytes(MESSAGE_LENGTH) for _ in range(rows)))
        (rec,) = client.list_recordings(stream_ids=[14])
        first = client.scan(rec.recording_id, rec.start_position, max_messages=1)
    frame = first.end - rec.start_position  # every message the same length
    cut = rec.recorded_position - tail * frame

    def load(**options: str):  # type: ignore[no-untyped-def]
        reader = spark.read.format("aeron").option("endpoint", endpoint).option("streamId", 14)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    def pushed() -> int:
        return _noop(load().filter(F.col("position") >= cut))

    def starting() -> int:
        return _noop(load(startingPositions=json.dumps({str(rec.recording_id): cut})))

    def unpushed() -> int:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
        try:
            return _noop(load().filter(F.col("position") >= cut))
        finally:
            spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")

    read: dict[str, int] = {}
    contenders = {"tail_pushed": pushed, "tail_starting_positions": starting}
    contenders["tail_unpushed"] = unpushed
    checked = {name: counted(name, run, tail, read) for name, run in contenders.items()}
    best = interleaved_best(checked, repeats)
    return {
        "tail_rows": tail,
        "tail_of_rows": rows,
        **{f"{name}_s": round(seconds, 3) for name, seconds in best.items()},
        "tail_pushed_to_starting_positions_ratio": round(
            best["tail_pushed"] / best["tail_starting_positions"], 3
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-latency", action="store_true", help="throughput only (no latency keys)")
    p.add_argument("--tail", type=int, default=1000, help="rows of the pushed-filter tail case")
    p.add_argument(
        "--tail-only",
        action="store_true",
        help="only the pushed-filter case: a --tail-row tail of a --rows-row recording",
    )
    args = p.parse_args()
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.server import ServerConfig, StreamServer

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-source")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ensure_registered(spark)
    spark.dataSource.register(CeilingSource)
    result: dict[str, object] = {
        "rows": args.rows,
        "message_length": MESSAGE_LENGTH,
        "master": "local[2]",
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        StreamServer(ServerConfig(directory=os.path.join(tmp, "s"), port=0)) as server,
    ):
        tail = _tail_case(spark, server.endpoint, args.rows, args.tail, args.repeats)
        result.update(tail)
        if args.tail_only:
            spark.stop()
            print(json.dumps(result))
            return 0
        per = args.rows // args.producers
        payload = bytes(MESSAGE_LENGTH)
        for _ in range(args.producers):
            with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
                client.publish(10, (payload for _ in range(per)))
        rows = per * args.producers
        # the same rows as Arrow IPC messages (~60 KiB each), published by the same producers
        from aeron_spark.connector.formats_arrow import encode_batches

        messages = [
            m
            for b in CeilingReader(per, 1).read(_Slice(0, per))
            for m in encode_batches(b, 128 * 1024)
        ]
        for _ in range(args.producers):
            with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
                client.publish(11, messages)

        # the SBE message, and the same rows as Arrow IPC messages (~60 KiB), one producer each
        from benchmarks import sbe_message

        sbe_table = sbe_message.table(rows)
        sbe_payloads = sbe_message.codec().encode(sbe_table)
        sbe_arrow = [
            m
            for b in sbe_table.to_batches(max_chunksize=65536)
            for m in encode_batches(b, 128 * 1024)
        ]
        for k in range(args.producers):  # as many recordings (partitions) as the others
            with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
                client.publish(12, sbe_payloads[k :: args.producers])
            with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
                client.publish(13, sbe_arrow[k :: args.producers])
        del sbe_payloads
        from pyspark.sql.pandas.types import from_arrow_schema

        sbe_ddl = ", ".join(
            f"`{f.name}` {f.dataType.simpleString()}"
            for f in from_arrow_schema(sbe_table.schema).fields
        )

        def aeron_sbe() -> int:
            return _noop(
                spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 12)
                .option("format", "sbe")
                .option("sbeSchema", sbe_message.SCHEMA_XML)
                .option("sbeMessage", "Trade")
                .load()
            )

        def aeron_sbe_arrow() -> int:
            return _noop(
                spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 13)
                .option("format", "arrow")
                .option("schema", sbe_ddl)
                .load()
            )

        def aeron_binary() -> int:
            return _noop(
                spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 10)
                .load()
            )

        def aeron_arrow() -> int:
            return _noop(
                spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 11)
                .option("format", "arrow")
                .option("schema", BINARY_SCHEMA_DDL)
                .load()
            )

        def ceiling() -> int:
            return _noop(
                spark.read.format("ceiling")
                .option("rows", rows)
                .option("partitions", args.producers)
                .load()
            )

        def rate() -> int:
            ckpt = tempfile.mkdtemp(dir=tmp)
            q = (
                spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", rows)
                .option("numPartitions", 2)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", ckpt)
                .trigger(once=True)
                .start()
            )
            q.awaitTermination()
            return sum(int(p["numInputRows"]) for p in q.recentProgress)

        contenders = {
            "ceiling": ceiling,
            "rate": rate,
            "binary": aeron_binary,
            "arrow": aeron_arrow,
            "sbe": aeron_sbe,
            "sbe_arrow": aeron_sbe_arrow,
        }
        read: dict[str, int] = {}
        checked = {name: counted(name, run, rows, read) for name, run in contenders.items()}
        try:
            best = interleaved_best(checked, args.repeats)
        except RowsMismatch as exc:
            spark.stop()
            print(f"error: {exc}; counts so far: {json.dumps(read)}", file=sys.stderr)
            return 2
        result["rows_read"] = rows  # every run of every contender read exactly this many
        for name, seconds in best.items():
            result[f"{name}_rows_per_s"] = round(rows / seconds)
        result["arrow_messages"] = len(messages) * args.producers
        if not args.no_latency:
            from benchmarks.source_latency import measure as measure_latency

            result.update(measure_latency(spark, server.endpoint))
    result.update(ceiling_ratios(result))
    result["mode"] = (
        "batch reads into noop (same read path as a micro-batch); rate via Trigger.Once"
    )
    spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

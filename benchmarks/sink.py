"""Rows/s from Spark's rate source into the aeron sink on local[2], 116-byte rows, side by side in
one run with the same query into ``noop`` and into a trivial Python Arrow sink (the ceiling of
Spark's Python write path).

    python -m benchmarks.sink [--rows 1000000]

Each figure is the best of ``--repeats`` runs (contenders taking turns, see ``_timing``) of one
micro-batch (``rate-micro-batch`` with
``rowsPerBatch`` = rows, ``Trigger.Once``) after a warm-up run. Prints one JSON object.

The ``sbe`` contender writes each row as a 103-byte SBE message (``benchmarks/sbe_message.py``:
15 columns from the rate source's value, ``format=sbe``); ``sbe_arrow`` writes the same 15
columns with ``format=arrow``: ``sbe_to_arrow_ratio`` is sbe / sbe_arrow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from benchmarks._timing import ceiling_ratios, interleaved_best  # noqa: E402

ROW_LENGTH = 116


class _Count(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class CeilingWriter(DataSourceStreamArrowWriter):
    def write(self, iterator):  # type: ignore[no-untyped-def]
        rows = 0
        for batch in iterator:
            column = batch.column(0)
            rows += len(column)
        return _Count(rows)

    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        pass

    def abort(self, messages, batchId):  # type: ignore[no-untyped-def]
        pass


class CeilingSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ceiling_sink"

    def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return CeilingWriter()


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.server import ServerConfig, StreamServer

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-sink")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ensure_registered(spark)
    spark.dataSource.register(CeilingSink)
    result: dict[str, object] = {"rows": args.rows, "row_length": ROW_LENGTH, "master": "local[2]"}
    with (
        tempfile.TemporaryDirectory() as tmp,
        StreamServer(ServerConfig(directory=os.path.join(tmp, "s"), port=0)) as server,
    ):
        runs = 0

        from benchmarks import sbe_message

        def run(fmt: str, select: list[str] | None = None, **options: str) -> None:
            nonlocal runs
            runs += 1
            df = (
                spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", args.rows)
                .option("numPartitions", 2)
                .load()
                .selectExpr(
                    *(
                        select
                        or [
                            f"cast(rpad(cast(value as string), {ROW_LENGTH}, 'x') as binary)"
                            " as value"
                        ]
                    )
                )
            )
            checkpoint = os.path.join(tmp, f"ck{runs}")
            writer = df.writeStream.format(fmt).option("checkpointLocation", checkpoint)
            for key, value in options.items():
                writer = writer.option(key, value)
            if fmt == "aeron":  # a new checkpoint is a new query: give it its own sink identity
                writer = writer.option("sinkId", f"bench-{runs}")
            q = writer.trigger(once=True).start()
            q.awaitTermination()
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))

        ep = server.endpoint
        contenders = {
            "noop": lambda: run("noop"),
            "ceiling": lambda: run("ceiling_sink"),
            "binary": lambda: run("aeron", endpoint=ep, streamId="20"),
            "arrow": lambda: run("aeron", endpoint=ep, streamId="21", format="arrow"),
            # for context, not a target: lz4-compressed arrow (these padded rows compress well)
            "arrow_lz4": lambda: run(
                "aeron", endpoint=ep, streamId="22", format="arrow", compression="lz4"
            ),
            "sbe": lambda: run(
                "aeron",
                sbe_message.SELECT,
                endpoint=ep,
                streamId="23",
                format="sbe",
                sbeSchema=sbe_message.SCHEMA_XML,
                sbeMessage="Trade",
            ),
            "sbe_arrow": lambda: run(
                "aeron", sbe_message.SELECT, endpoint=ep, streamId="24", format="arrow"
            ),
        }
        for name, seconds in interleaved_best(contenders, args.repeats).items():
            result[f"{name}_rows_per_s"] = round(args.rows / seconds)
        with StreamClient.connect(ClientSettings(endpoint=ep)) as client:
            binary = sum(r.recorded_position for r in client.list_recordings(stream_ids=[20]))
            arrow = sum(r.recorded_position for r in client.list_recordings(stream_ids=[21]))
            sbe_bytes = sum(r.recorded_position for r in client.list_recordings(stream_ids=[23]))
        result["binary_bytes_committed"] = binary
        result["sbe_bytes_committed"] = sbe_bytes
        result["arrow_bytes_committed"] = arrow
        runs_each = args.repeats + 1
        expected = runs_each * args.rows * (ROW_LENGTH + 32 + 12)  # aligned to 160 B frames
        if not expected <= binary <= expected + 4096 * runs_each:  # + per-commit framing
            raise RuntimeError(f"the sink committed {binary} bytes, expected {expected}")
        if sbe_bytes < runs_each * args.rows * (103 + 32):  # 103-byte messages, 32-byte frames
            raise RuntimeError(f"the sbe sink committed only {sbe_bytes} bytes")
        if arrow < runs_each * args.rows * ROW_LENGTH:
            raise RuntimeError(f"the arrow sink committed only {arrow} bytes")
    result.update(ceiling_ratios(result))
    spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

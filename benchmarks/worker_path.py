"""Rows/s of the binary source and sink paths a Python data-source worker runs, without Spark:
what is ours of the per-row cost (``benchmarks.kafka`` measures the whole query).

    python -m benchmarks.worker_path [--rows 2000000] [--partitions 2] [--repeats 3]
                                     [--profile source|sink|source_remote|sink_remote]
                                     [--spark] [--compare SITE --rounds 3]

An ``aeron-spark server`` runs in its own process (as in ``benchmarks.kafka``, so its CPU is not
this process's). The source contenders publish ``--rows`` 116-byte messages in ``--partitions``
sessions, then read each recording with ``source.read_range`` (what a task's ``read()`` runs)
into Arrow record batches: ``source_local`` from the server's files, ``source_remote`` replayed
over the session (``localReads=false``). The sink contenders write the same rows, as the Arrow
batches Spark hands a Python writer (10,000 rows each: ``maxRecordsPerBatch``), through the
sink's ``write`` path (stage, one part per partition) and the driver's ``commit``:
``sink_local`` (the default, local writes) and ``sink_remote`` (``localWrites=false``).

Each figure is the best of ``--repeats`` runs after a warm-up run, contenders taking turns
(``_timing``). CPU seconds of this process (``cpu_s_per_million_rows``) come from
``time.process_time``. ``--profile`` runs one contender under cProfile and prints the top
functions (by total time) to stderr (``--profile-server``: and the server's, sampled with
``py-spy`` when it is installed). ``--spark`` measures the same two paths through a Spark query
instead (see ``_spark``). Prints one JSON object.

Before/after in one run: install the code to compare against beside this checkout, e.g.
``git archive BASE | tar -x -C /tmp/base/src && pip install --no-deps --target /tmp/base/site
/tmp/base/src``, then ``--compare /tmp/base/site``: runs of the benchmark with that code
(``PYTHONPATH``, which the server and Spark's Python workers inherit) and with this one take
turns, ``--rounds`` times, each in a process of its own; the JSON has ``before_*``,
``after_*`` and ``speedup_*`` keys.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import itertools
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import pyarrow as pa

from benchmarks._timing import interleaved_best

VALUE_LENGTH = 116
SPARK_BATCH_ROWS = 10_000


def _values(first: int, count: int) -> list[bytes]:
    return [str(first + i).encode().ljust(VALUE_LENGTH, b"x") for i in range(count)]


def _sink_batches(rows: int, partitions: int) -> list[list[pa.RecordBatch]]:
    """Per partition, Arrow batches of one ``value binary`` column, as Spark hands them."""
    per = rows // partitions
    out = []
    for p in range(partitions):
        values = _values(p * per, per)
        out.append(
            [
                pa.RecordBatch.from_arrays(
                    [pa.array(values[i : i + SPARK_BATCH_ROWS], pa.binary())], names=["value"]
                )
                for i in range(0, per, SPARK_BATCH_ROWS)
            ]
        )
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of one process so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _py_spy(pid: int) -> tuple[subprocess.Popen[bytes], str]:
    out = os.path.join(tempfile.mkdtemp(prefix="worker-path-spy-"), "server.txt")
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    proc = subprocess.Popen(
        [spy, "record", "-p", str(pid), "-r", "250", "-f", "raw", "-o", out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached before the run
    return proc, out


def _py_spy_report(proc: subprocess.Popen[bytes], out: str, top: int = 25) -> None:
    """Self and inclusive samples per function of the server's busy samples."""
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(out) as fh:
        for line in fh:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if any(w in frames[-1] for w in ("select", "poll", "wait", "thread.py:81)")):
                continue  # idle
            total += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                inclusive[frame] += int(count)
    print(f"server busy samples: {total}", file=sys.stderr)
    for title, table in (("self", own), ("inclusive", inclusive)):
        print(f"-- server, {title}:", file=sys.stderr)
        for frame, count in table.most_common(top):
            print(f"{count:7d} {100 * count / max(1, total):5.1f}%  {frame}", file=sys.stderr)


def _spark(
    args: argparse.Namespace, endpoint: str, rows: int, server_pid: int, result: dict[str, object]
) -> int:
    """The same paths inside Spark (``local[2]``): ``spark_source`` reads the published rows
    with ``readStream`` + ``Trigger.AvailableNow`` into ``noop`` (``maxMessagesPerTrigger`` =
    ``--per-trigger``), ``spark_sink`` writes one ``rate-micro-batch`` batch of as many rows
    padded to 116 bytes with ``format("aeron")``; CPU seconds of every process (driver, JVM,
    Python workers, server) as ``benchmarks.kafka`` counts them."""
    from pyspark.sql import SparkSession

    from aeron_spark.connector.datasource import ensure_registered
    from benchmarks.kafka import Contender, _run_stream

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-worker-path")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ensure_registered(spark)
    seq = itertools.count()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-worker-path-") as tmp:

            def source() -> None:
                q = (
                    spark.readStream.format("aeron")
                    .option("endpoint", endpoint)
                    .option("streamId", 10)
                    .option("maxMessagesPerTrigger", args.per_trigger)
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", os.path.join(tmp, f"ck{next(seq)}"))
                    .trigger(availableNow=True)
                    .start()
                )
                _run_stream(q, rows)

            def sink() -> None:
                name = f"ck{next(seq)}"
                q = (
                    spark.readStream.format("rate-micro-batch")
                    .option("rowsPerBatch", rows)
                    .option("numPartitions", args.partitions)
                    .load()
                    .selectExpr(
                        f"cast(rpad(cast(value as string), {VALUE_LENGTH}, 'x') as binary) as value"
                    )
                    .writeStream.format("aeron")
                    .option("endpoint", endpoint)
                    .option("streamId", 20)
                    .option("sinkId", name)
                    .option("checkpointLocation", os.path.join(tmp, name))
                    .trigger(once=True)
                    .start()
                )
                _run_stream(q, rows)

            contenders = {
                "spark_source": Contender(source, server_pid, set()),
                "spark_sink": Contender(sink, server_pid, set()),
            }
            best = interleaved_best(dict(contenders), args.repeats)
    finally:
        spark.stop()
    for name, seconds in best.items():
        result[f"{name}_rows_per_s"] = round(rows / seconds)
        least = min(contenders[name].cpu[1:], key=lambda parts: sum(parts.values()))
        result[f"{name}_cpu_s_per_million_rows"] = round(sum(least.values()) / rows * 1e6, 3)
        for part, value in least.items():
            result[f"{name}_{part}_cpu_s_per_million_rows"] = round(value / rows * 1e6, 3)
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result))
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Runs of ``before`` (``PYTHONPATH=SITE``) and ``after`` taking turns, each a process of
    its own (its own server too), the best rows/s and least CPU of each kept."""
    base = [
        sys.executable,
        "-m",
        "benchmarks.worker_path",
        "--rows",
        str(args.rows),
        "--partitions",
        str(args.partitions),
        "--repeats",
        str(args.repeats),
        "--per-trigger",
        str(args.per_trigger),
        *(["--spark"] if args.spark else []),
    ]
    env_before = dict(os.environ, PYTHONPATH=os.path.abspath(args.compare))
    env_after = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, env in (("before", env_before), ("after", env_after)):
            out = subprocess.run(base, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result: dict[str, object] = {
        "rows": args.rows,
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
    }
    for key in runs["after"][0]:
        if key.endswith("_rows_per_s"):
            pick = max
        elif key.endswith("_million_rows"):
            pick = min
        else:
            continue
        for name in ("before", "after"):
            result[f"{name}_{key}"] = pick(r[key] for r in runs[name])
        if key.endswith("_rows_per_s"):
            result[f"speedup_{key}"] = round(
                result[f"after_{key}"]  # type: ignore[operator]
                / result[f"before_{key}"],
                2,
            )
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", choices=("source", "source_remote", "sink", "sink_remote"))
    p.add_argument(
        "--profile-server",
        action="store_true",
        help="with --profile: also sample the server with py-spy (if installed)",
    )
    p.add_argument(
        "--compare",
        metavar="SITE",
        help="before/after: alternate runs of this benchmark with the aeron_spark "
        "installed under SITE (e.g. pip install --target SITE of the base "
        "commit) and the current one, --rounds times; best figure of each",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--spark",
        action="store_true",
        help="measure the same paths through Spark (local[2]) instead",
    )
    p.add_argument(
        "--per-trigger",
        type=int,
        default=1_000_000,
        help="with --spark: the source's maxMessagesPerTrigger",
    )
    args = p.parse_args(argv)
    if args.compare:
        return _compare(args)

    from pyspark import TaskContext

    from aeron_spark.connector.client import ClientSettings, StreamClient, pooled
    from aeron_spark.connector.options import parse_sink_options
    from aeron_spark.connector.sink import AeronStreamWriter
    from benchmarks.kafka import aeron_server

    result: dict[str, object] = {
        "rows": args.rows,
        "value_length": VALUE_LENGTH,
        "partitions": args.partitions,
        "load_average_before": os.getloadavg(),
    }
    with aeron_server() as aeron:
        ep = aeron["endpoint"]
        settings = ClientSettings(endpoint=ep)
        per = args.rows // args.partitions
        rows = per * args.partitions
        for part in range(args.partitions):
            with StreamClient.connect(settings) as client:
                client.publish(10, _values(part * per, per))
        with pooled(settings) as client:
            recordings = client.list_recordings(stream_ids=[10])

        from aeron_spark.connector.source import read_range
        from aeron_spark.connector.stores.server import ServerRange, ServerStore

        def source(local: bool) -> Callable[[], None]:
            parts = [
                ServerRange(
                    ServerStore(settings, local),
                    str(r.recording_id),
                    r.recording_id,
                    r.start_position,
                    r.recorded_position,
                    r.initial_term_id,
                    r.term_length,
                    False,
                    local_reads=local,
                )
                for r in recordings
            ]

            def run() -> None:
                got = sum(b.num_rows for part in parts for b in read_range(part))
                if got != rows:
                    raise RuntimeError(f"read {got} rows, expected {rows}")

            return run

        batches = _sink_batches(rows, args.partitions)
        sink_ids = itertools.count()

        def sink(local: bool) -> Callable[[], None]:
            def run() -> None:
                options = parse_sink_options(
                    {
                        "endpoint": ep,
                        "streamId": "20",
                        "sinkId": f"w{next(sink_ids)}",
                        "localWrites": str(local).lower(),
                    }
                )
                writer = AeronStreamWriter(options)
                staged = []
                try:
                    for part, part_batches in enumerate(batches):
                        # what a Spark task has: its partition, attempt and micro-batch id
                        TaskContext._setTaskContext(
                            TaskContext(
                                stageId=0,
                                partitionId=part,
                                attemptNumber=0,
                                taskAttemptId=part,
                                localProperties={"streaming.sql.batchId": "0"},
                            )
                        )
                        staged.append(writer.write(iter(part_batches)))
                finally:
                    TaskContext._setTaskContext(None)
                writer.commit(staged, 0)

            return run

        contenders = {
            "source_local": source(True),
            "source_remote": source(False),
            "sink_local": sink(True),
            "sink_remote": sink(False),
        }
        if args.spark:
            return _spark(args, ep, rows, aeron["pid"], result)
        if args.profile:
            name = {"source": "source_local", "sink": "sink_local"}.get(args.profile, args.profile)
            contenders[name]()  # warm-up
            spy = _py_spy(aeron["pid"]) if args.profile_server else None
            prof = cProfile.Profile()
            prof.enable()
            contenders[name]()
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
            if spy is not None:
                _py_spy_report(*spy)
            return 0

        cpu: dict[str, float] = dict.fromkeys(contenders, float("inf"))
        server_cpu: dict[str, float] = dict.fromkeys(contenders, float("inf"))

        def timed_cpu(name: str, run: Callable[[], None]) -> Callable[[], None]:
            def wrapped() -> None:
                started, server_started = time.process_time(), _cpu_of(aeron["pid"])
                run()
                cpu[name] = min(cpu[name], time.process_time() - started)
                server_cpu[name] = min(server_cpu[name], _cpu_of(aeron["pid"]) - server_started)

            return wrapped

        best = interleaved_best({k: timed_cpu(k, v) for k, v in contenders.items()}, args.repeats)
        for name, seconds in best.items():
            result[f"{name}_rows_per_s"] = round(rows / seconds)
            result[f"{name}_cpu_s_per_million_rows"] = round(cpu[name] / rows * 1e6, 3)
            result[f"{name}_server_cpu_s_per_million_rows"] = round(
                server_cpu[name] / rows * 1e6, 3
            )
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

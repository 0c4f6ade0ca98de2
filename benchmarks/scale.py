"""Scale curves (issue 31), one JSON object: ``python -m benchmarks.scale --index``.

``--message-size``: one publish of one message of 1 ... 256 MiB (``--sizes-mib``) from a client
process to an ``aeron-spark server`` process (a fresh server per size, ``--no-encryption`` over
loopback UDP, so sessions are sealed all the same): the outcome (delivered, or refused and
whether anything was sent), the time, and each side's peak RSS (``VmHWM``) in MB and over the
message's size. ``--python`` runs both processes with another interpreter (another checkout's
venv, e.g. main's, to compare); ``--term-length`` is passed to the server (servers before issue
31 have no such option).

``--catalog``: a server (``aeron-spark server`` in a child process) over a directory of 10 ...
10,000 recordings (``--catalog-sizes``; most on one stream, one recording on a small stream of its
own): the client call ``latestOffset`` needs without a trigger limit (the recordings' positions:
``recording_positions`` where the server has it, else ``list_recordings`` and one ``scan`` per
recording, as the source did), ``list_recordings`` of the big and of the small stream, and the
server's idle CPU (per cent of a core over ``--idle-s`` seconds, from ``/proc``) and wake-ups (its
threads' voluntary context switches a second), with one idle session open.

``--recordings 1,8,64,256``: ``--messages`` 100-byte messages (1,000,000) over 1 ... 256
recordings (one stream each, written offline into one ``aeron-spark server`` directory, the server
in a child process), each stream read whole by ``spark.read.format("aeron")`` into ``noop`` on
``local[2]`` (the rows Spark counted checked): rows/s (best of ``--repeats`` after a warm-up, the
counts taking turns), input partitions, and ``ratio_256_to_8`` (the target of issue 31: >= 0.5).
``--unpacked`` adds each count read with ``maxPartitionBytes=1`` (one task a recording, as
before issue 31 item 2).

``--index``: the recording's position/time index at 1, 10 (and with ``--large``, 100) million
entries: the memory the server holds for it (tracemalloc peak while opening it and answering
lookups), the time to open it (a restart), a lookup's time, against the two Python lists the index
used to be (their memory measured at one million entries, then per entry).

``--sessions 16,64,256``: N sealed sessions open on one ``aeron-spark server`` (its own process,
UDP on loopback; the clients share one process and its driver): the server's CPU while every
session is idle (per session and in % of a core, over ``--idle-s``), then each session
publishing one 100-byte message a second for ``--publish-s`` (publish p50/p99, achieved
publishes/s, failures; the server's CPU over the round's own length and per publish net of its
idle cost, and this process's: the clients and their driver, so a harness that is the bottleneck
shows; ``--threads`` publishing threads, by default one per 16 sessions), then ``--handshakes``
new clients' connect time (p50/p99) with the N open, and the sessions lost (expired and
replaced by a reconnect) over the run. ``--latency-timeline FILE``: every publish of each round
appended to FILE as a JSON line (round, when due and when begun, seconds from the round's start
and ``began_wall`` as ``time.time()``, latency in ms, session, publishing thread), to see
whether slow publishes come together in time (a stall) or to some sessions. Run it with
another interpreter to measure another tree (``/work/main/.venv/bin/python -m benchmarks.scale
--sessions ...``): the server runs under the same interpreter.

``--soak SECONDS --soak-rate 2000``: a server under publishes (one session, 50 publishes a
second of ``rate / 50`` 100-byte messages), a live replay of them (another session) and a sink
committing a batch of 50 every 0.2 s (a third), for ``SECONDS``: RSS every minute (stderr as it
goes, ``curve`` in the JSON), the baseline at 5 minutes, the end over the baseline (issue 31's
target: within 10% over 60 minutes), messages/s achieved. By default the server runs in this
process under tracemalloc (the RSS is the process's, the clients' logs included; growth from the
baseline by line and by traceback); ``--soak-server-process``: an ``aeron-spark server`` process
of its own, its RSS from ``/proc`` (no tracemalloc: the rate is not cut by it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from typing import Any

import numpy as np

from aeron_spark import AeronSparkError
from aeron_spark.connector.client import StreamClient
from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.session.settings import ClientSettings
from aeron_spark.connector.testing_restart import RestartableServer
from aeron_spark.transport.archive import RecordingStore
from aeron_spark.transport.archive.fdcache import FdCache
from aeron_spark.transport.archive.timeindex import TimeIndex
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from benchmarks import _proc


def _index_file(path: str, n: int) -> None:
    arr = np.empty((n, 2), dtype="<i8")
    arr[:, 0] = np.arange(1, n + 1, dtype=np.int64) * 64
    arr[:, 1] = np.arange(n, dtype=np.int64) * 1_000_000
    arr.tofile(path)


def _lists_bytes_per_entry(n: int = 1_000_000) -> float:
    """What the lists held: two Python lists of ints (positions, times)."""
    tracemalloc.start()
    positions = [64 * (i + 1) for i in range(n)]
    times = [1_700_000_000_000_000_000 + i * 1_000_000 for i in range(n)]
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del positions, times
    return size / n


def index_curve(sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"lists_bytes_per_entry": round(_lists_bytes_per_entry(), 1)}
    directory = tempfile.mkdtemp(prefix="aeron-spark-scale-")
    try:
        path = os.path.join(directory, "index")
        rows = []
        for n in sizes:
            _index_file(path, n)
            rng = np.random.default_rng(1)
            probes = [int(p) for p in rng.integers(0, 64 * n, 2_000)]
            files = FdCache(4)
            tracemalloc.start()
            started = time.perf_counter()
            index = TimeIndex(path, files.use)
            opened = time.perf_counter() - started
            for p in probes:
                index.floor(p)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            started = time.perf_counter()  # timed without tracemalloc's cost per allocation
            for p in probes:
                index.floor(p)
            lookup = (time.perf_counter() - started) / len(probes)
            files.close()
            rows.append(
                {
                    "entries": n,
                    "held_bytes_peak": peak,
                    "held_mb_per_10m_entries": round(peak * 10_000_000 / n / 1e6, 2),
                    "lists_mb_estimate": round(out["lists_bytes_per_entry"] * n / 1e6),
                    "open_ms": round(opened * 1000, 1),
                    "random_lookup_us": round(lookup * 1e6, 2),
                }
            )
            os.unlink(path)
        out["index"] = rows
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


_MESSAGE_CLIENT = r"""
import json, os, sys, time
from aeron_spark.connector.client import ClientSettings, StreamClient

def hwm_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

endpoint, size = sys.argv[1], int(sys.argv[2])
client = StreamClient.connect(ClientSettings(endpoint=endpoint, encryption=False, timeout_s=300))
client.publish(10, [b"warm"])
baseline = hwm_kib()
payload = b"\x5a" * size
out = {"client_baseline_kib": baseline}
started = time.perf_counter()
try:
    client.publish(10, [payload])
    out["outcome"] = "delivered"
except Exception as exc:
    out["outcome"] = "refused"
    out["error"] = str(exc)[:160]
out["seconds"] = round(time.perf_counter() - started, 3)
out["client_peak_kib"] = hwm_kib()
client.close()  # a session refused halfway may still hold errors for the chunks that followed
with StreamClient.connect(ClientSettings(endpoint=endpoint, encryption=False)) as other:
    out["server_bytes_received"] = other.stats()["transport"]["bytes_received"]
print(json.dumps(out))
"""


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def message_size_curve(
    sizes_mib: list[int], python: str, term_length: str | None
) -> dict[str, Any]:
    rows = []
    for size_mib in sizes_mib:
        directory = tempfile.mkdtemp(prefix="aeron-spark-scale-msg-")
        log_path = os.path.join(directory, "server.log")
        extra = ["--term-length", term_length] if term_length else []
        code = (
            "import sys; from aeron_spark.connector.server import server_main; "
            "sys.exit(server_main(sys.argv[1:]))"
        )
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [python, "-c", code, "--dir", os.path.join(directory, "d"), "--port", "0"]
                + ["--no-encryption", *extra],
                stdout=log,
                stderr=log,
            )
        try:
            endpoint = None
            deadline = time.monotonic() + 60
            while endpoint is None and time.monotonic() < deadline and server.poll() is None:
                with open(log_path) as fh:
                    for line in fh:
                        if "listening on" in line:
                            endpoint = line.split("listening on ")[1].split()[0]
                time.sleep(0.05)
            if endpoint is None:
                with open(log_path) as fh:
                    raise RuntimeError(f"the server did not start: {fh.read()[-1000:]}")
            server_baseline = _hwm_kib(server.pid)
            done = subprocess.run(
                [python, "-c", _MESSAGE_CLIENT, endpoint, str(size_mib * 1024 * 1024)],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if done.returncode != 0:
                raise RuntimeError(f"the client failed: {done.stderr[-1500:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            server_peak = _hwm_kib(server.pid)
        finally:
            server.kill()
            server.wait(30)
            shutil.rmtree(directory, ignore_errors=True)
        size = size_mib * 1024 * 1024
        client_peak = row.pop("client_peak_kib") * 1024
        client_base = row.pop("client_baseline_kib") * 1024
        rows.append(
            {
                "size_mib": size_mib,
                "outcome": row["outcome"],
                **({"error": row["error"]} if "error" in row else {}),
                "seconds": row["seconds"],
                # what the server's transport received in all (the session's control traffic
                # included): a refusal before sending leaves it at a few KB
                "server_received_mb": round(row["server_bytes_received"] / 1e6, 2),
                "client_peak_mb": round(client_peak / 1e6, 1),
                "client_peak_over_size": round(client_peak / size, 2),
                # above the client's own baseline and the payload it built
                "client_extra_over_size": round((client_peak - client_base - size) / size, 2),
                "server_peak_mb": round(server_peak * 1024 / 1e6, 1),
                "server_peak_over_size": round(server_peak * 1024 / size, 2),
                "server_extra_over_size": round((server_peak - server_baseline) * 1024 / size, 2),
            }
        )
    return {"message_size": rows, "python": python, "term_length": term_length or "default"}


BIG_STREAM, SMALL_STREAM = 10, 11


def _populate(directory: str, count: int, messages: int = 10) -> None:
    """``count`` stopped recordings of ``messages`` 100-byte messages each: one on the small
    stream, the rest on the big one (written offline, as a server would have)."""
    store = RecordingStore(directory, fsync=False, max_open_files=16)
    term = 64 * 1024 * 1024
    payloads = [b"x" * 100] * messages
    for n in range(count):
        stream = SMALL_STREAM if n == count // 2 else BIG_STREAM
        rec = store.create(stream, n + 1, "session:bench", 0, 0, 0, term, 8192, time.time_ns())
        framer = Framer(LogGeometry(term, 8192, 0), n + 1, stream, 0)
        for position, block in framer.frame(payloads, None):
            rec.append(block, position, time.time_ns())
        rec.stop(time.time_ns())
    store.close(time.time_ns())


def _populate_streams(directory: str, counts: list[int], messages: int) -> dict[int, int]:
    """For each count N of ``counts``, ``messages`` 100-byte messages over N stopped recordings
    of stream ``1000 + N`` (written offline, as a server would have); stream by count."""
    store = RecordingStore(directory, fsync=False, max_open_files=16)
    term = 64 * 1024 * 1024
    payload = b"x" * 100
    session = 0
    streams = {}
    for count in counts:
        stream = streams[count] = 1000 + count
        for n in range(count):
            session += 1
            each = messages // count + (1 if n < messages % count else 0)
            rec = store.create(
                stream, session, "session:bench", 0, 0, 0, term, 8192, time.time_ns()
            )
            framer = Framer(LogGeometry(term, 8192, 0), session, stream, 0)
            for position, block in framer.frame([payload] * each, None):
                rec.append(block, position, time.time_ns())
            rec.stop(time.time_ns())
    store.close(time.time_ns())
    return streams


def recordings_curve(
    counts: list[int], messages: int, repeats: int, unpacked: bool
) -> dict[str, Any]:
    """Rows/s of a batch read of ``messages`` messages over each count of recordings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import Observation, SparkSession
    from pyspark.sql import functions as F

    from aeron_spark.connector.datasource import ensure_registered
    from benchmarks._timing import interleaved_best

    keys = tempfile.mkdtemp(prefix="aeron-spark-scale-keys-")
    os.environ["AERON_SPARK_KEY_STORE"] = keys
    directory = tempfile.mkdtemp(prefix="aeron-spark-scale-recordings-")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-scale-recordings")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ensure_registered(spark)
    out: dict[str, Any] = {"messages": messages, "master": "local[2]", "curve": []}
    try:
        data = os.path.join(directory, "server")
        streams = _populate_streams(data, counts, messages)
        with RestartableServer(data) as server:

            def frame(count: int, **options: Any) -> Any:
                reader = (
                    spark.read.format("aeron")
                    .option("endpoint", server.endpoint)
                    .option("encryption", "false")
                    .option("streamId", streams[count])
                )
                for name, value in options.items():
                    reader = reader.option(name, value)
                return reader.load()

            def run(count: int, **options: Any) -> Any:
                def read() -> None:
                    observed = Observation()
                    df = frame(count, **options)
                    df.observe(observed, F.count(F.lit(1)).alias("rows")).write.format("noop").mode(
                        "overwrite"
                    ).save()
                    got = int(observed.get["rows"])
                    if got != messages:
                        raise RuntimeError(f"{count} recordings: read {got} rows, not {messages}")

                return read

            runs = {f"{n}": run(n) for n in counts}
            if unpacked:
                runs.update({f"{n}_unpacked": run(n, maxPartitionBytes=1) for n in counts})
            best = interleaved_best(runs, repeats)
            for name, seconds in best.items():
                count = int(name.split("_")[0])
                options = {"maxPartitionBytes": 1} if name.endswith("unpacked") else {}
                out["curve"].append(
                    {
                        "recordings": count,
                        "packed": not name.endswith("unpacked"),
                        "partitions": frame(count, **options).rdd.getNumPartitions(),
                        "rows_per_s": round(messages / seconds),
                    }
                )
        rate = {(r["recordings"], r["packed"]): r["rows_per_s"] for r in out["curve"]}
        if (256, True) in rate and (8, True) in rate:
            out["ratio_256_to_8"] = round(rate[256, True] / rate[8, True], 3)
        if (256, False) in rate and (8, False) in rate:
            out["ratio_256_to_8_unpacked"] = round(rate[256, False] / rate[8, False], 3)
    finally:
        spark.stop()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
    return out


def _positions(client: StreamClient, stream: int) -> tuple[str, int]:
    """What latestOffset asks the server, without a trigger limit: message-boundary ends."""
    if hasattr(client, "recording_positions"):
        return "recording_positions", len(client.recording_positions(stream_ids=[stream]))
    recs = client.list_recordings(stream_ids=[stream])
    for r in recs:
        client.scan(r.recording_id, r.start_position, r.recorded_position)
    return "list_recordings+scan", len(recs)


def _timed(fn: Any, repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def catalog_curve(sizes: list[int], idle_s: float) -> list[dict[str, Any]]:
    rows = []
    keys = tempfile.mkdtemp(prefix="aeron-spark-scale-keys-")
    os.environ["AERON_SPARK_KEY_STORE"] = keys  # the server's key and the client's known keys
    for n in sizes:
        directory = tempfile.mkdtemp(prefix="aeron-spark-scale-catalog-")
        try:
            data = os.path.join(directory, "server")
            _populate(data, n)
            with RestartableServer(data) as server:
                assert server.proc is not None
                settings = ClientSettings(endpoint=server.endpoint, encryption=False, timeout_s=120)
                with StreamClient.connect(settings) as client:
                    started = time.perf_counter()
                    how, _ = _positions(client, BIG_STREAM)
                    first = time.perf_counter() - started
                    again, _ = _timed(
                        lambda: _positions(client, BIG_STREAM), 1 if first > 1.0 else 3
                    )
                    small, _ = _timed(lambda: _positions(client, SMALL_STREAM), 5)
                    list_big, _ = _timed(lambda: client.list_recordings([BIG_STREAM]), 3)
                    list_small, _ = _timed(lambda: client.list_recordings([SMALL_STREAM]), 5)
                    time.sleep(2.0)  # past the first stat snapshot and the session's settling
                    cpu0, t0 = _proc.cpu_s(server.proc.pid), time.monotonic()
                    wakes0 = _proc.wakeups(server.proc.pid)
                    time.sleep(idle_s)
                    wall = time.monotonic() - t0
                    cpu = (_proc.cpu_s(server.proc.pid) - cpu0) / wall
                    wakeups = (_proc.wakeups(server.proc.pid) - wakes0) / wall
                    stat = os.path.join(data, "stat.json")
                    stat_bytes = os.path.getsize(stat) if os.path.exists(stat) else None
                    # the recordings' own file (issue 31 item 4: rewritten only when one changed)
                    held = os.path.join(data, "stat-recordings.json")
                    held_bytes = os.path.getsize(held) if os.path.exists(held) else None
            rows.append(
                {
                    "recordings": n,
                    "positions_call": how,
                    "latest_offset_first_ms": round(first * 1000, 1),
                    "latest_offset_ms": round(again * 1000, 1),
                    "latest_offset_small_stream_ms": round(small * 1000, 2),
                    "list_recordings_big_ms": round(list_big * 1000, 1),
                    "list_recordings_small_ms": round(list_small * 1000, 2),
                    "idle_cpu_percent": round(cpu * 100, 2),
                    "idle_wakeups_per_s": round(wakeups, 1),
                    "stat_json_bytes": stat_bytes,
                    "stat_recordings_json_bytes": held_bytes,
                    "load_average_1m": os.getloadavg()[0],
                }
            )
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    shutil.rmtree(keys, ignore_errors=True)
    return rows


def soak(seconds: float, rate: int, server_process: bool = False) -> dict[str, Any]:
    """A server under ``rate`` messages/s of publishes (one client, 50 publishes a second), a
    live replay of them and a sink committing a batch of 50 every 0.2 s, for ``seconds``.

    In this process (the default): the process's RSS (server and the three clients: the
    clients' log buffers are in it) every minute, a baseline at 5 minutes (or a fifth of the run
    when shorter), what tracemalloc sees grow from the baseline to the end (by line in the
    connector and transport code, and the top tracebacks anywhere), and the committer's
    remembered commits (bounded by its window). ``server_process``: the server is an
    ``aeron-spark server`` process of its own (no tracemalloc anywhere: the rate is the one the
    done-when of issue 31 names), its RSS sampled from ``/proc``."""
    import threading

    directory = tempfile.mkdtemp(prefix="aeron-spark-scale-soak-")
    keys = tempfile.mkdtemp(prefix="aeron-spark-scale-keys-")
    os.environ["AERON_SPARK_KEY_STORE"] = keys
    stop = threading.Event()
    if not server_process:
        tracemalloc.start(8)
    out: dict[str, Any] = {
        "seconds": seconds,
        "rate": rate,
        "server": "own process" if server_process else "in process, tracemalloc",
    }
    try:
        with contextlib.ExitStack() as stack:
            data = os.path.join(directory, "srv")
            if server_process:
                child = stack.enter_context(RestartableServer(data))
                assert child.proc is not None
                pid = child.proc.pid
                endpoint = child.endpoint
                core = None
            else:
                from aeron_spark.connector.server import ServerConfig, StreamServer

                config = ServerConfig(directory=data, port=0, encryption=False)
                server = stack.enter_context(StreamServer(config))
                pid = os.getpid()
                endpoint = server.endpoint
                core = server.core
            settings = ClientSettings(endpoint=endpoint, encryption=False, timeout_s=60)
            published = [0]

            def publish() -> None:
                with StreamClient.connect(settings) as client:
                    batch = max(1, rate // 50)
                    while not stop.is_set():
                        started = time.monotonic()
                        client.publish(1, [b"m" * 100] * batch)
                        published[0] += batch
                        stop.wait(max(0.0, 0.02 - (time.monotonic() - started)))

            read = [0]

            def replay() -> None:
                with StreamClient.connect(settings) as client:
                    while not client.list_recordings([1]) and not stop.is_set():
                        time.sleep(0.05)
                    (rec,) = client.list_recordings([1])
                    for block in client.replay(rec.recording_id, rec.start_position, None):
                        read[0] += len(block.data)
                        if stop.is_set():
                            break

            committed = [0]

            def sink() -> None:
                with StreamClient.connect(settings) as client:
                    batch = 0
                    while not stop.is_set():
                        part = client.stage("soak", batch, 0, 0, 2, [b"s" * 100] * 50)
                        client.commit("soak", batch, 2, [part])
                        committed[0] += 1
                        batch += 1
                        stop.wait(0.2)

            threads = [threading.Thread(target=f, daemon=True) for f in (publish, replay, sink)]
            for t in threads:
                t.start()
            began = time.monotonic()
            base_at = min(300.0, seconds / 5)
            step = min(60.0, seconds / 10)
            curve: list[dict[str, Any]] = []
            first = None
            rss_first = anon_first = -1
            next_sample = began + step
            cpu0 = _proc.cpu_s(pid)
            while True:
                now = time.monotonic()
                if first is None and now - began >= base_at:
                    first = tracemalloc.take_snapshot() if not server_process else True
                    rss_first, anon_first = _rss_kib(pid=pid), _rss_kib("RssAnon:", pid)
                    print(
                        f"soak baseline at {now - began:.0f} s: rss {rss_first} KiB",
                        file=sys.stderr,
                        flush=True,
                    )
                if now >= next_sample or now - began >= seconds:
                    point = {
                        "t_s": round(now - began),
                        "rss_kib": _rss_kib(pid=pid),
                        "rss_anon_kib": _rss_kib("RssAnon:", pid),
                        "published": published[0],
                        "replayed_bytes": read[0],
                        "sink_commits": committed[0],
                        "cpu_s": round(_proc.cpu_s(pid) - cpu0, 1),
                        "load_1m": os.getloadavg()[0],
                    }
                    if not server_process:
                        point["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
                    curve.append(point)
                    print("soak " + json.dumps(point), file=sys.stderr, flush=True)
                    next_sample += step
                if now - began >= seconds:
                    break
                time.sleep(max(0.05, min(next_sample, began + seconds) - time.monotonic()))
            elapsed = time.monotonic() - began
            rss_last, anon_last = _rss_kib(pid=pid), _rss_kib("RssAnon:", pid)
            last = tracemalloc.take_snapshot() if not server_process else None
            stop.set()
            for t in threads:
                t.join(30)
            out.update(
                published=published[0],
                msgs_per_s=round(published[0] / elapsed, 1),
                replayed_bytes=read[0],
                sink_commits=committed[0],
                baseline_at_s=base_at,
                rss_kib_baseline=rss_first,
                rss_anon_kib_baseline=anon_first,
                rss_kib_end=rss_last,
                rss_anon_kib_end=anon_last,
                rss_end_over_baseline=round(rss_last / rss_first, 3),
                curve=curve,
            )
            if core is not None and last is not None and isinstance(first, tracemalloc.Snapshot):
                mine = [
                    tracemalloc.Filter(True, "*/connector/*"),
                    tracemalloc.Filter(True, "*/transport/*"),
                    tracemalloc.Filter(True, "*/aeron_spark/*"),
                ]
                diff = last.filter_traces(mine).compare_to(first.filter_traces(mine), "lineno")
                by_tb = last.compare_to(first, "traceback")
                out.update(
                    committer_done=len(core.committer.done),
                    commit_log_bytes=core.committer.log.size,
                    growth_top=[
                        {
                            "where": str(d.traceback[0]),
                            "size_diff": d.size_diff,
                            "count_diff": d.count_diff,
                        }
                        for d in diff[:15]
                    ],
                    growth_by_traceback=[
                        {
                            "traceback": [str(f) for f in d.traceback],
                            "size_diff": d.size_diff,
                            "count_diff": d.count_diff,
                        }
                        for d in by_tb[:10]
                    ],
                )
    finally:
        stop.set()
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
    return out


def _rss_kib(field: str = "VmRSS:", pid: int | None = None) -> int:
    with open(f"/proc/{pid or 'self'}/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return -1


def _quantile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _publish_round(
    clients: list[Any],
    seconds: float,
    threads: int,
    start: float | None = None,
    slot: tuple[int, int] = (0, 1),
    raw: bool = False,
    timeline: list[tuple[float, float, float, int, int]] | None = None,
) -> dict[str, Any]:
    """Every client publishes one message a second (spread over the second) for ``seconds``.
    ``start``: the round's ``time.monotonic()`` (system-wide: the same in every process);
    ``slot`` (k, K): these clients are process k's of K, the i-th publishing at the second's
    (i * K + k)-th of ``len(clients) * K`` instants, so K processes' publishes interleave
    evenly instead of coming K at once; ``raw``: the latencies themselves (for the parent);
    ``timeline``: each publish appended as (due, began, latency) in seconds from ``start``
    (latency -1: failed), session index, publishing thread."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    start = time.monotonic() + 0.2 if start is None else start
    n = len(clients)
    k_slot, k_all = slot

    def worker(k: int) -> None:
        mine = list(range(k, n, threads))
        local: list[float] = []
        events: list[tuple[float, float, float, int, int]] = []
        failed = 0
        for second in range(int(seconds)):
            for i in mine:
                due = start + second + (i * k_all + k_slot) / (n * k_all)
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                began = time.monotonic()
                t0 = time.perf_counter()
                try:
                    clients[i].publish(1 + i % 8, [b"p" * 100])
                except Exception:  # noqa: BLE001 - a failed publish is a figure, not an abort
                    failed += 1
                    if timeline is not None:
                        events.append((due - start, began - start, -1.0, i, k))
                    continue
                latency = time.perf_counter() - t0
                local.append(latency)
                if timeline is not None:
                    events.append((due - start, began - start, latency, i, k))
        with lock:
            latencies.extend(local)
            failures[0] += failed
            if timeline is not None:
                timeline.extend(events)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(min(threads, n))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = max(time.monotonic() - start, 1e-9)
    if raw:
        return {"latencies": latencies, "failures": failures[0], "elapsed": elapsed}
    return _round_figures(latencies, failures[0], elapsed, n)


def _round_figures(latencies: list[float], failures: int, elapsed: float, n: int) -> dict[str, Any]:
    return {
        "publish_elapsed_s": round(elapsed, 2),
        "publishes": len(latencies),
        "publishes_per_s": round(len(latencies) / elapsed, 1),
        "wanted_per_s": n,
        "publish_p50_ms": round(_quantile(latencies, 0.5) * 1000, 1),
        "publish_p99_ms": round(_quantile(latencies, 0.99) * 1000, 1),
        "publish_failures": failures,
    }


def _client_process(
    endpoint: str, key_dir: str, count: int, slot: tuple[int, int], threads: int, conn: Any
) -> None:
    """One of ``--client-processes``: opens ``count`` sessions, says so, then publishes a round
    each time it is told a start (and length) and sends back the latencies and how many
    sessions it lost so far, then closes them when told. Its own driver, as each Spark task
    process has."""
    from aeron_spark.connector.client import ClientSettings, StreamClient

    settings = ClientSettings(
        endpoint=endpoint, encryption=True, key_store_dir=key_dir, timeout_s=30
    )
    clients = [StreamClient.connect(settings) for _ in range(count)]
    try:
        conn.send("open")
        while (word := conn.recv()) != "close":  # a round's (start, seconds), or "close"
            start, seconds = word
            timeline: list[tuple[float, float, float, int, int]] = []
            out = _publish_round(
                clients, seconds, threads, start=start, slot=slot, raw=True, timeline=timeline
            )
            # session indices the parent's: this process's i-th is the (i * K + k)-th
            out["timeline"] = [
                (due, began, lat, i * slot[1] + slot[0], k) for due, began, lat, i, k in timeline
            ]
            out["lost"] = sum(c._generation for c in clients)
            conn.send(out)
    finally:
        for c in clients:
            c.close()


class _ClientProcesses:
    """``--client-processes K``: the N sessions opened by K processes, N / K each (as a Spark
    job's tasks would be: each process has its own driver and GIL), publishing rounds on the
    parent's word."""

    def __init__(self, endpoint: str, key_dir: str, n: int, k: int, threads: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.pipes = []
        self.procs = []
        for slot in range(k):
            count = n // k + (1 if slot < n % k else 0)
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_client_process,
                args=(endpoint, key_dir, count, (slot, k), max(1, threads // k), child),
                daemon=True,
            )
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:
            if not pipe.poll(600) or pipe.recv() != "open":
                raise RuntimeError("a client process did not open its sessions")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def publish_round(
        self, seconds: float, n: int, start: float, timeline: list[Any] | None = None
    ) -> tuple[dict[str, Any], int]:
        for pipe in self.pipes:
            pipe.send((start, seconds))
        latencies: list[float] = []
        failures = lost = 0
        elapsed = 0.0
        for slot, pipe in enumerate(self.pipes):
            out = pipe.recv()
            latencies.extend(out["latencies"])
            if timeline is not None:  # threads numbered per process: K * thread + slot
                k_all = len(self.pipes)
                timeline.extend(
                    (due, began, lat, i, k * k_all + slot)
                    for due, began, lat, i, k in out["timeline"]
                )
            failures += out["failures"]
            lost += out["lost"]
            elapsed = max(elapsed, out["elapsed"])
        return _round_figures(latencies, failures, elapsed, n), lost

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send("close")
            except OSError:
                pass
        for proc in self.procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join(10)


def _write_timeline(path: str, sessions: int, name: str, start: float, events: list[Any]) -> None:
    """``--latency-timeline``: a round's publishes appended to ``path`` as JSON lines, in the
    order they began: the round (``sessions``, ``round``), when it was due and when it began
    (seconds from the round's start; ``began_wall`` the same instant as ``time.time()``, to set
    beside a server's log), the latency (ms; null: the publish failed), the session's index and
    the publishing thread's."""
    to_wall = time.time() - time.monotonic()
    with open(path, "a") as fh:
        for due, began, latency, i, k in sorted(events, key=lambda e: e[1]):
            line = {
                "sessions": sessions,
                "round": name,
                "due_s": round(due, 6),
                "began_s": round(began, 6),
                "began_wall": round(start + began + to_wall, 6),
                "latency_ms": None if latency < 0 else round(latency * 1000, 3),
                "session": i,
                "thread": k,
            }
            fh.write(json.dumps(line) + "\n")


def _round(
    name: str,
    seconds: float,
    n: int,
    pid: int,
    spread: _ClientProcesses | None,
    clients: list[Any],
    threads: int,
    timeline_path: str | None,
) -> tuple[dict[str, Any], int]:
    """A publishing round (this process's clients, or the client processes'): its figures and
    the sessions the processes lost; its timeline appended to ``timeline_path`` where asked."""
    _phase(name, n, pid)
    start = time.monotonic() + (0.5 if spread is not None else 0.2)
    events: list[Any] | None = [] if timeline_path else None
    out: tuple[dict[str, Any], int]
    if spread is not None:
        out = spread.publish_round(seconds, n, start, events)
    else:
        out = _publish_round(clients, seconds, threads, start=start, timeline=events), 0
    if timeline_path and events is not None:
        _write_timeline(timeline_path, n, name, start, events)
    return out


def _phase(name: str, sessions: int, pid: int) -> None:
    """A marker on stderr as a phase starts (a profiler attached to the server waits for it)."""
    print(json.dumps({"phase": name, "sessions": sessions, "server_pid": pid}), file=sys.stderr)
    sys.stderr.flush()


def _server_session_counters(directory: str) -> dict[str, Any]:
    """The server's own session counts from its ``stat.json`` (written every second or so)."""
    try:
        with open(os.path.join(directory, "stat.json")) as fh:
            counters = json.load(fh)["counters"]
    except (OSError, ValueError, KeyError):
        return {}
    names = ("sessions_opened", "sessions_expired", "session_leases_renewed_by_transport")
    return {f"server_{name}": counters.get(name) for name in names}


def sessions_curve(
    counts: list[int],
    idle_s: float,
    publish_s: float,
    handshakes: int,
    threads: int,
    client_processes: int = 1,
    warm_up: bool = False,
    timeline_path: str | None = None,
) -> list[dict[str, Any]]:
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server.testing import server_process

    rows = []
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="aeron-spark-scale-") as tmp:
            # the server's defaults (2048 of 4096 sessions from one address) where they suffice
            limit = n + handshakes + 16
            extra = (
                []
                if limit <= 2048
                else ["--max-clients", str(limit), "--max-per-address", str(limit)]
            )
            with server_process(f"{tmp}/srv", extra) as (proc, endpoint):
                settings = ClientSettings(
                    endpoint=endpoint, encryption=True, key_store_dir=f"{tmp}/keys", timeout_s=30
                )
                row: dict[str, Any] = {
                    "sessions": n,
                    "client_processes": client_processes,
                    "warm_up": warm_up,
                    "load_average_1m": os.getloadavg()[0],
                }
                started = time.perf_counter()
                spread = None
                clients: list[Any] = []
                publishing = threads or max(32, n // 16)
                if client_processes > 1:
                    spread = _ClientProcesses(
                        endpoint, f"{tmp}/keys", n, client_processes, publishing
                    )
                else:
                    clients = [StreamClient.connect(settings) for _ in range(n)]
                row["open_all_s"] = round(time.perf_counter() - started, 1)
                # the clients' processes: this one, or also the K it started (drivers of their own)
                mine = [os.getpid()] + (spread.pids() if spread is not None else [])

                def clients_cpu(mine: list[int] = mine) -> float:
                    return sum(_proc.cpu_s(pid) for pid in mine)

                try:
                    time.sleep(2.0)  # the handshakes' tails settle
                    _phase("idle", n, proc.pid)
                    cpu0, mine0, t0 = _proc.cpu_s(proc.pid), clients_cpu(), time.monotonic()
                    time.sleep(idle_s)
                    cpu = _proc.cpu_s(proc.pid) - cpu0
                    wall = time.monotonic() - t0
                    idle_rate = cpu / wall  # the server's CPU-seconds a second while idle
                    row["idle_server_cpu_pct"] = round(100 * cpu / wall, 2)
                    row["idle_server_cpu_us_per_session_s"] = round(1e6 * cpu / wall / n, 1)
                    # the N clients and their drivers (the harness's own cost)
                    row["idle_client_cpu_pct"] = round(100 * (clients_cpu() - mine0) / wall, 1)
                    row["server_open_fds"] = len(os.listdir(f"/proc/{proc.pid}/fd"))
                    # the idle figures on their own first: a later phase may abort the run
                    print(json.dumps({"idle": row}), file=sys.stderr, flush=True)

                    if warm_up:  # each session's first publish (its recording made), unmeasured
                        _round(
                            "warm-up", 1, n, proc.pid, spread, clients, publishing, timeline_path
                        )
                        time.sleep(2.0)
                    cpu0, mine0 = _proc.cpu_s(proc.pid), clients_cpu()
                    figures, lost_in_processes = _round(
                        "publish",
                        publish_s,
                        n,
                        proc.pid,
                        spread,
                        clients,
                        publishing,
                        timeline_path,
                    )
                    row.update(figures)
                    # over the round's own length: a round that fell behind lasts longer than
                    # --publish-s (the figure was divided by --publish-s, so overstated)
                    elapsed = row["publish_elapsed_s"]
                    used = _proc.cpu_s(proc.pid) - cpu0
                    row["publish_server_cpu_pct"] = round(100 * used / elapsed, 1)
                    row["publish_client_cpu_pct"] = round(
                        100 * (clients_cpu() - mine0) / elapsed, 1
                    )
                    # a publish's own server CPU: the round's, less what idling costs meanwhile
                    row["publish_server_cpu_us_each"] = round(
                        1e6 * (used - idle_rate * elapsed) / max(row["publishes"], 1), 1
                    )
                    _phase("handshakes", n, proc.pid)
                    times = []
                    failed = 0
                    for _ in range(handshakes):
                        t = time.perf_counter()
                        try:
                            extra_client = StreamClient.connect(settings)
                        except AeronSparkError:  # counted: one failure ends no run
                            failed += 1
                            continue
                        times.append(time.perf_counter() - t)
                        extra_client.close()
                    if times:
                        row["handshake_p50_ms"] = round(_quantile(times, 0.5) * 1000, 1)
                        row["handshake_p99_ms"] = round(_quantile(times, 0.99) * 1000, 1)
                    row["handshake_failures"] = failed
                    row["sessions_lost"] = lost_in_processes + sum(c._generation for c in clients)
                    row.update(_server_session_counters(f"{tmp}/srv"))
                finally:
                    for c in clients:
                        c.close()
                    if spread is not None:
                        spread.close()
                row["server_alive"] = proc.poll() is None
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # survives a later abort
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--index", action="store_true", help="the time index curve")
    parser.add_argument("--large", action="store_true", help="also 100 million entries (1.6 GB)")
    parser.add_argument(
        "--message-size", action="store_true", help="one message of 1 ... 256 MiB published"
    )
    parser.add_argument("--sizes-mib", default="1,4,8,16,64,256", help="--message-size's sizes")
    parser.add_argument(
        "--python", default=sys.executable, help="--message-size: the client's and server's"
    )
    parser.add_argument("--term-length", default=None, help="--message-size: the server's")
    parser.add_argument("--recordings", help="recordings per query: counts, e.g. 1,8,64,256")
    parser.add_argument("--messages", type=int, default=1_000_000, help="--recordings' total")
    parser.add_argument("--repeats", type=int, default=2, help="--recordings' timed runs")
    parser.add_argument(
        "--unpacked", action="store_true", help="--recordings: also maxPartitionBytes=1"
    )
    parser.add_argument("--catalog", action="store_true", help="the catalog curve")
    parser.add_argument(
        "--catalog-sizes", default="10,100,1000,10000", help="recordings (comma separated)"
    )
    parser.add_argument(
        "--idle-s", type=float, default=10.0, help="idle window (catalog CPU, sessions)"
    )
    parser.add_argument("--soak", type=float, default=0, help="soak seconds (tracemalloc)")
    parser.add_argument("--soak-rate", type=int, default=2000, help="soak messages/s")
    parser.add_argument(
        "--soak-server-process",
        action="store_true",
        help="--soak: the server in a process of its own (its RSS; no tracemalloc)",
    )
    parser.add_argument("--sessions", help="the sessions curve: counts, e.g. 16,64,256,2048")
    parser.add_argument("--publish-s", type=float, default=10.0, help="publishing (sessions)")
    parser.add_argument("--handshakes", type=int, default=20, help="new connects (sessions)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="publishing threads (sessions; default one per 16 sessions, at least 32: each "
        "publishes for its sessions in turn, so fewer would cap the rate at threads / latency)",
    )
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="sessions: each session publishes once before the measured round (its recording "
        "made: without it the round's first second makes N recordings at once)",
    )
    parser.add_argument(
        "--latency-timeline",
        metavar="FILE",
        help="sessions: every publish of each round appended to FILE as a JSON line (when it "
        "was due, when it began, its latency, its session and publishing thread), to see "
        "whether slow publishes come together in time or to some sessions",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="sessions: the clients' processes (default 1: every session in this process, one "
        "driver and one GIL for all; K: N / K sessions in each of K processes, as a Spark job's "
        "tasks would hold them, the publishing threads shared among them)",
    )
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.sessions:
        counts = [int(c) for c in args.sessions.split(",")]
        result["sessions"] = sessions_curve(
            counts,
            args.idle_s,
            args.publish_s,
            args.handshakes,
            args.threads,
            args.client_processes,
            args.warm_up,
            args.latency_timeline,
        )
    if args.recordings:
        counts = [int(c) for c in args.recordings.split(",")]
        result["recordings"] = recordings_curve(counts, args.messages, args.repeats, args.unpacked)
    if args.catalog:
        sizes = [int(s) for s in args.catalog_sizes.split(",")]
        result["catalog"] = catalog_curve(sizes, args.idle_s)
    if args.soak:
        # a soak stopped with SIGTERM still stops its server process and removes its directories
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        result["soak"] = soak(args.soak, args.soak_rate, args.soak_server_process)
    if args.index or not any(
        [args.index, args.catalog, args.soak, args.message_size, args.sessions, args.recordings]
    ):
        sizes = [1_000_000, 10_000_000] + ([100_000_000] if args.large else [])
        result.update(index_curve(sizes))
    if args.message_size:
        sizes_mib = [int(s) for s in args.sizes_mib.split(",")]
        result.update(message_size_curve(sizes_mib, args.python, args.term_length))
    result["load_average_1m_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""The aeron source and sink through Spark Connect: a Connect server started from the installed
PySpark (``sbin/start-connect-server.sh``, its bundled ``spark-connect`` jar), one per module, and
a ``SparkSession.builder.remote("sc://...")`` client in its own process (see
``_connect_client.py``) against stream servers on loopback.

What the client reports is checked against the stream server read directly (the transport's term
reader over ``StreamClient.read_range``) and, for parquet output, against pyarrow's reading of the
files: values, stream, session and recording ids, positions and reserved values, row by row.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pyarrow.parquet as pq
import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import messages_of

pytestmark = pytest.mark.spark

CLIENT = Path(__file__).with_name("_connect_client.py")
STARTED = re.compile(rb"Spark Connect server started at: \S+:(\d+)")
Row = tuple[bytes, int, int, int, int, int]  # value, stream, session, recording, position, reserved


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _end_group(proc: subprocess.Popen, wait_s: float) -> None:
    """SIGTERM the server's process group (java, its Python workers), then SIGKILL what is
    left after ``wait_s``: nothing of it outlives the module."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture(scope="module")
def connect_url() -> Iterator[str]:
    import pyspark

    home = Path(pyspark.__file__).parent
    assert list((home / "jars").glob("spark-connect_*.jar")), f"no spark-connect jar in {home}"
    work = Path(tempfile.mkdtemp(prefix="aeron-spark-connect-"))
    for sub in ("logs", "pids", "local", "tmp"):
        (work / sub).mkdir()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work / "pids"),
        # the server's Python workers: this interpreter, with the package and its `connect` extra
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": free_port(),
        "spark.ui.enabled": "false",  # no UI port to contend for with the classic session
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.local.dir": work / "local",
        "spark.sql.warehouse.dir": work / "warehouse",
        "spark.sql.shuffle.partitions": 2,
    }
    command = [
        "bash",
        str(home / "sbin" / "start-connect-server.sh"),
        "--wait",  # in the foreground: its process group is ours to end
        *("--master", "local[2,4]"),  # as the suite's classic session: 4 attempts per task
        *("--driver-memory", "512m"),
        *("--driver-java-options", f"-Djava.io.tmpdir={work / 'tmp'} -XX:-UsePerfData"),
        *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
    ]
    log_path = work / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=work,  # derby.log, metastore_db, spark-warehouse: all under work
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # The port it reports (Spark moves to the next one if the chosen port was taken since).
        deadline = time.monotonic() + 240
        port = None
        while port is None:
            found = STARTED.search(log_path.read_bytes())
            if found:
                port = int(found.group(1))
            elif proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                pytest.fail(f"the Spark Connect server did not start (exit {proc.poll()}):\n{tail}")
            else:
                time.sleep(0.25)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _end_group(proc, 60)
        shutil.rmtree(work)


class Client:
    """The ``_connect_client.py`` process: one Connect session, one scenario per request."""

    def __init__(self, url: str, errors: IO[bytes]) -> None:
        self.errors = errors
        self.proc = subprocess.Popen(
            [sys.executable, str(CLIENT), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.requests = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str) -> str:
        deadline = time.monotonic() + 300
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.errors.seek(0)
                tail = self.errors.read()[-6000:].decode(errors="replace")
                pytest.fail(
                    f"the Connect client gave no {prefix} (exit {self.proc.poll()}):\n{tail}"
                )
            if line.startswith(prefix):
                return line.removeprefix(prefix)

    def run(self, scenario: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.requests += 1  # a reply to an earlier request that timed out is passed over
        request = {"id": self.requests, "scenario": scenario, "args": args}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.expect("REPLY:"))
        while reply["id"] != self.requests:
            reply = json.loads(self.expect("REPLY:"))
        if "error" in reply:
            pytest.fail(f"Connect client {scenario} failed:\n{reply['error']}")
        return reply["result"]  # type: ignore[no-any-return]

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the client stops its session and exits
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def client(connect_url: str) -> Iterator[Client]:
    with tempfile.TemporaryFile() as errors:
        c = Client(connect_url, errors)
        try:
            c.expect("READY")
            yield c
        finally:
            c.close()


def publish(endpoint: str, stream_id: int, payloads: list[bytes]) -> None:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(stream_id, payloads)


def stored(endpoint: str, stream_id: int) -> list[Row]:
    """Every message of the stream as the server holds it, read without Spark."""
    out: list[Row] = []
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        for rec in client.list_recordings(stream_ids=[stream_id]):
            blocks = client.read_range(rec.recording_id, rec.start_position, rec.recorded_position)
            for m in messages_of(blocks, rec.initial_term_id, rec.term_length):
                out.append(
                    (
                        m.payload,
                        stream_id,
                        rec.session_id,
                        rec.recording_id,
                        m.position,
                        m.reserved_value,
                    )
                )
    return sorted(out)


def from_json(rows: list[list[Any]]) -> list[Row]:
    return sorted((bytes.fromhex(r[0]), *r[1:]) for r in rows)  # type: ignore[misc]


def from_parquet(path: Path) -> list[Row]:
    table = pq.read_table(path).to_pylist()  # pyarrow skips _spark_metadata and .crc files
    return sorted(
        (
            r["value"],
            r["stream_id"],
            r["session_id"],
            r["recording_id"],
            r["position"],
            r["reserved_value"],
        )
        for r in table
    )


def messages(producer: int, count: int) -> list[bytes]:
    return [f"p{producer}-{i:05d}-{'x' * (i % 40)}".encode() for i in range(count)]


def test_batch_read_over_connect(client, server):  # type: ignore[no-untyped-def]
    publish(server.endpoint, 10, messages(0, 300))
    publish(server.endpoint, 10, messages(1, 200))  # a second session: a second recording
    expected = stored(server.endpoint, 10)
    assert len(expected) == 500 and len({r[3] for r in expected}) == 2
    one = sorted((r for r in expected if r[0].startswith(b"p0-")), key=lambda r: r[4])
    got = client.run(
        "batch_read",
        endpoint=server.endpoint,
        stream_id=10,
        recording_id=one[0][3],
        range=[one[10][4], one[20][4]],
    )
    assert got["schema"] == (
        "struct<value:binary,stream_id:int,session_id:int,recording_id:bigint,position:bigint,"
        "timestamp:timestamp,reserved_value:bigint>"
    )
    assert from_json(got["rows"]) == expected
    assert from_json(got["range"]) == one[10:20]
    assert [r[0] for r in one] == messages(0, 300)


def test_streaming_read_available_now_over_connect(client, server, tmp_path):  # type: ignore[no-untyped-def]
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    publish(server.endpoint, 11, messages(0, 300))
    first = stored(server.endpoint, 11)
    got = client.run(
        "streaming_read",
        endpoint=server.endpoint,
        stream_id=11,
        out=str(out),
        checkpoint=str(checkpoint),
        table="aeron_connect_read",
    )
    assert from_json(got["memory"]) == first
    assert from_parquet(out) == first
    # a restart from the checkpoint reads what came since, nothing twice
    publish(server.endpoint, 11, messages(1, 200))
    publish(server.endpoint, 11, messages(0, 50))
    client.run(
        "streaming_read",
        endpoint=server.endpoint,
        stream_id=11,
        out=str(out),
        checkpoint=str(checkpoint),
        table=None,
    )
    every = stored(server.endpoint, 11)
    assert len(every) == 550 and len({r[3] for r in every}) == 3
    assert from_parquet(out) == every


def test_batch_write_over_connect(client, server):  # type: ignore[no-untyped-def]
    rows = [(f"w-{i:04d}".encode(), i * 7) for i in range(600)]
    client.run(
        "batch_write",
        endpoint=server.endpoint,
        stream_id=20,
        sink_id="connect-batch",
        rows=[[v.hex(), r] for v, r in rows],
    )
    assert sorted((r[0], r[5]) for r in stored(server.endpoint, 20)) == rows


def test_streaming_write_over_connect(client, server, tmp_path):  # type: ignore[no-untyped-def]
    publish(server.endpoint, 30, messages(0, 400))
    args = {
        "endpoint": server.endpoint,
        "stream_in": 30,
        "stream_out": 31,
        "sink_id": "connect-copy",
        "checkpoint": str(tmp_path / "ckpt"),
        "max_per_trigger": 150,
    }
    got = client.run("streaming_write", **args)
    assert got["batches"] == [0, 1, 2]  # 150 + 150 + 100

    def copied() -> list[tuple[bytes, int]]:
        # each source message once, "!" appended, its source position as the reserved value
        return sorted((r[0], r[5]) for r in stored(server.endpoint, 31))

    assert copied() == sorted((r[0] + b"!", r[4]) for r in stored(server.endpoint, 30))
    publish(server.endpoint, 30, messages(1, 100))
    got = client.run("streaming_write", **args)
    assert got["batches"] == [3]
    source = stored(server.endpoint, 30)
    assert len(source) == 500
    assert copied() == sorted((r[0] + b"!", r[4]) for r in source)


def test_foreach_batch_over_connect(client, server, tmp_path):  # type: ignore[no-untyped-def]
    """The function runs in the Connect server's Python, which needs the package and pyspark's
    Connect client packages (the `connect` extra): it gets a Connect session of its own."""
    out = tmp_path / "batches"
    publish(server.endpoint, 50, messages(0, 250))
    publish(server.endpoint, 50, messages(1, 120))
    client.run(
        "foreach_batch",
        endpoint=server.endpoint,
        stream_in=50,
        stream_out=51,
        out=str(out),
        checkpoint=str(tmp_path / "ckpt"),
        max_per_trigger=100,
    )
    source = stored(server.endpoint, 50)
    table = pq.read_table(out).to_pylist()
    assert from_parquet(out) == source  # every message once, every column as stored
    sizes: dict[int, int] = {}
    for r in table:
        sizes[r["batch_id"]] = sizes.get(r["batch_id"], 0) + 1
    assert sorted(sizes) == [0, 1, 2, 3] and sorted(sizes.values()) == [70, 100, 100, 100]
    assert sorted(r[0] for r in stored(server.endpoint, 51)) == sorted(r[0].upper() for r in source)

"""The README's five-minute tour, run as a new user runs it: its blocks in order, one after the
other, while the server started by the first block keeps running.

The tour's ports are moved as a whole onto a free pair (40123 -> P, 40124 -> P + 1, ...), so what
collides in the README collides here too; its paths go under the test's own directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOUR_BASE_PORT = 40123  # the README's server port; the tour's other ports are moved with it


def _tour_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python", "python"], blocks
    return blocks


def _server_ports(bash: str) -> set[int]:
    """UDP ports the tour's server takes: its --port and port + 1 (its replies)."""
    (port,) = re.findall(r"aeron-spark server .*--port (\d+)", bash)
    return {int(port), int(port) + 1}


def test_tour_transport_snippet_does_not_bind_the_servers_ports() -> None:
    (_, bash), (_, spark_code), (_, transport_code) = _tour_blocks()
    taken = _server_ports(bash)
    assert TOUR_BASE_PORT in taken
    bound = {int(p) for p in re.findall(r"aeron:udp\?endpoint=[\w.]+:(\d+)", transport_code)}
    assert bound, transport_code
    assert not bound & taken, f"the transport snippet binds {bound & taken}, the server's ports"
    # the Spark snippet talks to the server started above, on its port
    assert set(re.findall(r'"127\.0\.0\.1:(\d+)"', spark_code)) == {str(TOUR_BASE_PORT)}


def test_tour_says_which_python_spark_needs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    before_spark = section.split("```python", 1)[0]
    assert "PYSPARK_PYTHON=.venv/bin/python" in before_spark


def _free_udp_pair() -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65534:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no free pair of UDP ports")


def _adapt(code: str, base: int, tmp: Path) -> str:
    def move(m: re.Match[str]) -> str:
        return str(base + int(m.group(0)) - TOUR_BASE_PORT)

    code = re.sub(r"(?<!\d)401[2-9]\d(?!\d)", move, code)
    code = code.replace("/tmp/aeron-data", str(tmp / "aeron-data"))
    code = code.replace("/tmp/ckpt-upper", str(tmp / "ckpt-upper"))
    return code.replace(".venv/bin/", os.path.dirname(sys.executable) + "/")


@pytest.mark.spark
def test_tour_runs_in_order(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from aeron_spark.connector.server.testing import client_for, messages_of

    (_, bash), (_, spark_code), (_, transport_code) = _tour_blocks()
    base = _free_udp_pair()
    lines = [line for line in _adapt(bash, base, tmp_path).splitlines() if line.strip()]
    server_line = lines[0].split("#", 1)[0].strip()
    assert server_line.endswith("&"), lines[0]
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(
        ["bash", "-c", f"exec {server_line[:-1]}"],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    query = None
    try:
        outputs = []
        for line in lines[1:]:  # publish, tail, stat: right after the server, as typed
            done = subprocess.run(
                ["bash", "-c", line],
                capture_output=True,
                text=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
            assert done.returncode == 0, (line, done.stderr[-3000:])
            outputs.append(done.stdout)
        published, tailed, stat = outputs
        assert '"messages": 1000' in published
        assert [row.split("\t")[2] for row in tailed.splitlines()] == ["1", "2", "3", "4", "5"]
        assert "recordings" in stat

        before = {q.id for q in spark.streams.active}
        exec(_adapt(spark_code, base, tmp_path), {"spark": spark})  # noqa: S102 - the README's
        (query,) = [q for q in spark.streams.active if q.id not in before]
        endpoint = f"127.0.0.1:{base}"
        deadline = time.monotonic() + 180
        payloads: list[bytes] = []
        while len(payloads) < 1000:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"{len(payloads)} of 1000 rows on stream 20"
            time.sleep(0.5)
            with client_for(endpoint, encryption=True) as client:
                payloads = []
                for rec in client.list_recordings(stream_ids=[20]):
                    blocks = client.replay(
                        rec.recording_id, rec.purged_position, rec.recorded_position
                    )
                    payloads += [
                        m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)
                    ]
        assert sorted(payloads) == sorted(str(i).encode() for i in range(1, 1001))

        printed = io.StringIO()  # the transport snippet, while the server still runs
        with contextlib.redirect_stdout(printed):
            exec(_adapt(transport_code, base, tmp_path), {})  # noqa: S102
        assert printed.getvalue().startswith("b'hello'"), printed.getvalue()
    finally:
        if query is not None:
            query.stop()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
        log.close()
    assert server.returncode == 0, (tmp_path / "server.log").read_text()[-3000:]

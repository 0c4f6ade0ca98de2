"""The sink's exactly-once promise (README: each batch appended once per (sinkId, batch id),
"a batch committed again after a restart never duplicates data") under a ``kill -9`` of the
stream server at a chosen instant of a streaming write: while the batch's tasks have staged parts
on the server and its commit has not completed (the batch's staging directory exists), twice.
The server comes back after 1 s on the same ports and directory; the query (``timeoutMs`` 30 s)
must go on and write every row once. The query, its helpers and the server are the ride-through
test's (``test_ride_through.py``), which kills at an instant it does not choose."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from aeron_spark.connector.testing_restart import RestartableServer
from spark_tests.test_ride_through import CHUNK, _publish, _start_copy, _wait_written, _written

pytestmark = pytest.mark.spark

SINK_ID = "ride-through"  # the copy query's sinkId


def _batches_staging(directory: str) -> set[str]:
    """The batch ids with a staging directory on the server (staged, not yet committed). The
    server stages under the sink's commit identity: ``sinkId``, or ``sinkId@<checkpoint
    digest>`` when Spark passes the checkpoint (a streaming query does), hex-encoded."""
    root = os.path.join(directory, "sink", "staged")
    try:
        identities = os.listdir(root)
    except FileNotFoundError:
        return set()
    out: set[str] = set()
    for name in identities:
        try:
            identity = bytes.fromhex(name).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if identity == SINK_ID or identity.startswith(SINK_ID + "@"):
            try:
                out |= {f"{name}/{b}" for b in os.listdir(os.path.join(root, name))}
            except FileNotFoundError:
                continue
    return out


def _kill_while_staged(
    server: RestartableServer, before: set[str], timeout_s: float = 120.0
) -> bool:
    """Kill the server as soon as a batch not in ``before`` is staging (restart it after 1 s);
    False when none was seen staging in time (it came and went between two looks)."""
    deadline = time.monotonic() + timeout_s
    seen = False
    while time.monotonic() < deadline and not seen:
        seen = bool(_batches_staging(server.directory) - before)
        if not seen:
            time.sleep(0.01)
    server.restart_later(1.0)
    server.wait_restarted()
    return seen


def test_a_server_killed_while_a_batch_is_staged_writes_rows_once(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    directory = str(tmp_path / "server")
    with RestartableServer(directory) as server:
        endpoint = server.endpoint
        expected = _publish(endpoint, "a")
        query = _start_copy(spark, endpoint, tmp_path / "ckpt", True)
        try:
            got = _wait_written(query, endpoint, CHUNK)
            hits = 0
            for n in range(2):
                before = _batches_staging(directory)
                expected += _publish(endpoint, f"b{n}")
                hits += _kill_while_staged(server, before)
                expected += _publish(endpoint, f"c{n}")
                got = _wait_written(query, endpoint, len(expected))
                assert query.exception() is None and query.isActive
        finally:
            query.stop()
        got = _written(endpoint)  # after the query stopped: nothing came twice later either
    assert hits >= 1, "no kill landed while a batch was staged"
    assert sorted(got) == sorted(expected)  # every row, none twice

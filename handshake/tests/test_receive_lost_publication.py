"""A receive waiting for a reply wakes when its publication loses the server (a crashed
server's status messages stop: the publication goes unconnected after the driver's
``publication_connection_timeout_ns``), not at its next re-check slice: before, the wait
noticed only when a slice ended (500 ms) or the server's image timed out on this side (the
image liveness timeout, 10 s by default)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import aeron_spark.handshake.connection as connection_module
from aeron_spark.handshake import Client, ClientConfig
from aeron_spark.transport import Driver, DriverConfig

# a handshake server in its own process that never answers a message (it is killed -9 while
# the client waits for its reply)
_SERVER = """
import sys, time
from aeron_spark.handshake import Server, ServerConfig
server = Server(ServerConfig(key_store_dir=sys.argv[1]), on_message=None).start()
print(server.endpoint, flush=True)
time.sleep(600)
"""

_LOST_AFTER_NS = 2_000_000_000  # the shortest publication connection timeout the driver takes
_SLICE_S = 60.0  # the receive's re-check slice, longer than the whole test: only a wake-up ends it


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(tmp_path / "server-keys")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()  # bounded: the child exits on any failure
        assert endpoint, f"the server did not start (exit {proc.wait(60)})"
        yield proc, endpoint
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_receive_wakes_when_its_publication_loses_a_crashed_server(
    server_process: tuple[subprocess.Popen[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, endpoint = server_process
    monkeypatch.setattr(connection_module, "_WAIT_SLICE_S", _SLICE_S)
    driver = Driver(
        DriverConfig(write_counters_file=False, publication_connection_timeout_ns=_LOST_AFTER_NS)
    ).start()
    try:
        client = Client(
            ClientConfig(key_store_dir=str(tmp_path / "client-keys"), timeout_s=60.0),
            driver=driver,
        )
        conn = client.connect(endpoint)
        lost_at: list[float] = []
        assert conn.publication.add_lost_listener(lambda: lost_at.append(time.monotonic()))
        conn.send(b"no answer comes")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        killed = time.monotonic()
        got = conn.receive(_SLICE_S / 2)
        returned = time.monotonic()
        assert got is None
        assert lost_at, "receive returned before the publication was lost"
        # woken by the loss: the image of the dead server still lives here (its liveness
        # timeout, 10 s, is far from over), so only the publication's loss can have ended it
        waited = returned - lost_at[0]
        assert conn.subscription.is_connected, (
            f"receive returned {returned - killed:.1f} s after the kill, {waited:.1f} s after "
            "the publication was lost: only when the server's image timed out"
        )
        assert not conn.is_connected
        conn.close()
    finally:
        driver.close()

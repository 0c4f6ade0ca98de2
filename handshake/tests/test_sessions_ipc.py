"""Same-host handshakes over aeron:ipc (clients name the server as ``ipc:<port>``): the same state
machine and sessions as UDP, through shared-memory log buffers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aeron_spark.handshake import (
    Client,
    ClientConfig,
    Server,
    ServerConfig,
    TooManyConnectionsError,
)
from aeron_spark.transport import Driver, DriverConfig

from .conftest import wait_for


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = base / f"aeron-spark-hs-test-{os.getpid()}-{id(tmp_path)}"
    yield path
    shutil.rmtree(path, ignore_errors=True)  # the drivers' directory (every run left one)


def _ipc_files(directory: Path) -> list[str]:
    folder = directory / "ipc"
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_ipc_handshake_echo_limits_and_clean_up(tmp_path: Path, shm_dir: Path) -> None:
    config = DriverConfig(directory=shm_dir, write_counters_file=False)
    with Driver(config) as server_driver, Driver(config) as client_driver:
        server = Server(
            ServerConfig(key_store_dir=str(tmp_path / "s"), max_per_address=30),
            driver=server_driver,
            on_message=lambda c, m: c.send(m),
        ).start()
        try:
            client = Client(
                ClientConfig(key_store_dir=str(tmp_path / "c"), timeout_s=10), driver=client_driver
            )
            endpoint = f"ipc:{server.port}"
            with client.connect(endpoint) as conn:
                assert conn.encrypted and conn.is_connected
                conn.send(b"over shared memory")
                assert conn.receive(30) == b"over shared memory"
                assert conn.ping(5) > 0

            def session(i: int) -> bytes | None:
                with client.connect(endpoint) as c:
                    c.send(b"%d" % i)
                    return c.receive(30)

            with ThreadPoolExecutor(8) as pool:
                assert sorted(pool.map(session, range(20))) == sorted(b"%d" % i for i in range(20))
            held = [client.connect(endpoint) for _ in range(30)]  # every IPC client is "ipc"
            with pytest.raises(TooManyConnectionsError, match="ipc already has 30"):
                client.connect(endpoint)
            for conn in held:
                conn.close()
            wait_for(lambda: server.stats()["connections"] == 0, 60, "sessions reaped")
            assert server.stats()["connected"] == 51 and not server.core.session_ids
        finally:
            server.close()
        # Every session's log buffer files are gone once both sides closed.
        wait_for(lambda: _ipc_files(shm_dir) == [], 15, f"IPC files removed: {_ipc_files(shm_dir)}")

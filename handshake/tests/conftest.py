from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aeron_spark.handshake import Client, ClientConfig, Server, ServerConfig
from aeron_spark.transport import Driver, DriverConfig


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    """Poll ``condition`` until true; fail (naming ``what``) after ``timeout_s`` (sized for a
    loaded 2-core machine: the wait ends as soon as the condition holds)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        time.sleep(0.01)


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """host:port of a UDP socket on loopback that takes datagrams and never answers (a
    server down, its host black-holing UDP, or one hostile to its clients): a handshake to it
    holds its slot for its whole timeout (the kernel's port unreachable is no answer Aeron
    takes, and nobody binds the ports after it here)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def client_driver() -> Iterator[Driver]:
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    yield driver
    driver.close()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(echo: bool = True, key_dir: str = "server-keys", **kw: object) -> Server:
        config = ServerConfig(key_store_dir=str(tmp_path / key_dir), **kw)  # type: ignore[arg-type]
        server = Server(config, on_message=(lambda c, m: c.send(m)) if echo else None)
        servers.append(server.start())
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def make_client(tmp_path: Path, client_driver: Driver) -> Callable[..., Client]:
    def make(**kw: object) -> Client:
        kw.setdefault("key_store_dir", str(tmp_path / "client-keys"))
        kw.setdefault("timeout_s", 30.0)  # a connect expected to succeed, at load 20
        return Client(ClientConfig(**kw), driver=client_driver)  # type: ignore[arg-type]

    return make

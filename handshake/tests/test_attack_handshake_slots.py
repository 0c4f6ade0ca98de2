"""A server that never answers takes a process's handshake slots (MAX_CONCURRENT_HANDSHAKES).

A process runs at most 16 handshakes at once so that reopening all its sessions is not refused
by a server's pending limit per /24. The limit was one for the whole process, all servers
together: 16 connects to an endpoint that never answers (a server down, its host black-holing
UDP, or one hostile to its clients) held every slot for their whole timeout, and a connect to a
healthy server in the same process (a Spark executor reading two servers) waited behind them
and failed with HANDSHAKE_TIMEOUT without a datagram sent. And a connect that got a slot late
then ran its handshake with its own full timeout: up to twice the timeout it was given.

Real UDP sockets on 127.0.0.1: a socket bound and never read stands for the silent server.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aeron_spark.handshake import (
    Client,
    ClientConfig,
    ConnectionClosedError,
    HandshakeTimeoutError,
)
from aeron_spark.handshake.client import MAX_CONCURRENT_HANDSHAKES
from aeron_spark.transport import Driver, DriverConfig

from .conftest import wait_for


def _in_handshake() -> int:
    """This process's threads inside a handshake attempt (past the slot wait)."""
    return sum(
        any(f.f_code.co_qualname == "_Attempt.run" for f in _stack(frame))
        for frame in sys._current_frames().values()
    )


def _stack(frame):  # type: ignore[no-untyped-def]
    while frame is not None:
        yield frame
        frame = frame.f_back


def _own_client(keys: Path, timeout_s: float) -> tuple[Driver, Client]:
    """A client on a driver of its own (closed by the test to end its connects at once)."""
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    return driver, Client(ClientConfig(key_store_dir=str(keys), timeout_s=timeout_s), driver=driver)


def _start_silent(
    client: Client, endpoint: str, errors: list[BaseException]
) -> list[threading.Thread]:
    def run() -> None:
        try:
            client.connect(endpoint).close()
        except BaseException as exc:  # noqa: BLE001 - the test reads them
            errors.append(exc)

    threads = [
        threading.Thread(target=run, name=f"silent-{i}", daemon=True)
        for i in range(MAX_CONCURRENT_HANDSHAKES)
    ]
    for t in threads:
        t.start()
    return threads


def _finish(threads: list[threading.Thread], driver: Driver, close_first: bool = False) -> None:
    """Each silent handshake ends at its timeout, or (``close_first``) as its driver closes."""
    if close_first:
        driver.close()
    for t in threads:
        t.join(90.0)
    driver.close()
    assert not any(t.is_alive() for t in threads), "a silent handshake outlived its timeout"


def test_attack_a_silent_server_does_not_starve_connects_to_another(
    tmp_path, make_server, make_client: Callable[..., Client], silent_endpoint: str
) -> None:
    healthy = make_server()
    silent_driver, silent_client = _own_client(tmp_path / "silent-keys", 25.0)
    errors: list[BaseException] = []
    threads = _start_silent(silent_client, silent_endpoint, errors)
    try:
        wait_for(
            lambda: _in_handshake() == MAX_CONCURRENT_HANDSHAKES,
            what=f"{MAX_CONCURRENT_HANDSHAKES} handshakes with the silent endpoint under way",
        )
        started = time.monotonic()
        try:
            conn = make_client(timeout_s=15.0).connect(healthy.endpoint)
        except HandshakeTimeoutError as exc:
            raise AssertionError(
                f"a connect to a healthy server failed after {time.monotonic() - started:.1f} s "
                f"while {MAX_CONCURRENT_HANDSHAKES} handshakes with a silent one were under way: "
                f"{exc}"
            ) from exc
        try:
            conn.send(b"served")
            assert conn.receive(30.0) == b"served"
        finally:
            conn.close()
        assert not errors, errors  # the silent ones still waiting (25 s), none failed yet
    finally:
        # their driver closed: they end now, not at their 25 s timeout (the test's length)
        _finish(threads, silent_driver, close_first=True)


def test_attack_a_connect_waiting_for_a_slot_keeps_its_own_timeout(
    tmp_path, silent_endpoint: str
) -> None:
    """The 17th connect to a silent endpoint: its timeout counts from the call, the wait for a
    slot included (one freed midway gave the handshake a whole timeout more)."""
    timeout_s = 6.0
    driver, client = _own_client(tmp_path / "keys", timeout_s)
    errors: list[BaseException] = []
    threads = _start_silent(client, silent_endpoint, errors)
    try:
        wait_for(
            lambda: _in_handshake() == MAX_CONCURRENT_HANDSHAKES,
            what=f"{MAX_CONCURRENT_HANDSHAKES} handshakes with the silent endpoint under way",
        )
        time.sleep(1.0)  # part of the others' timeout gone: a slot frees midway through ours
        started = time.monotonic()
        with pytest.raises(HandshakeTimeoutError) as raised:
            client.connect(silent_endpoint)
        took = time.monotonic() - started
        print(f"the 17th connect (timeout {timeout_s} s) failed after {took:.1f} s: {raised.value}")
        # its own timeout and the loop's margin, never a second timeout after a slot's wait
        assert took < timeout_s + 2.0, f"a connect with a {timeout_s} s timeout took {took:.1f} s"
    finally:
        _finish(threads, driver)


def test_a_connect_ends_when_its_driver_is_closed(tmp_path, silent_endpoint: str) -> None:
    """Connects to a silent endpoint whose driver is closed under them end at once with
    ConnectionClosedError naming the closed driver: on main each waited on its closed HELLO
    publication, whose wait returned at once, in a loop (a thread's CPU) until its whole
    timeout, then raised HandshakeTimeoutError."""
    driver, client = _own_client(tmp_path / "keys", 20.0)
    errors: list[BaseException] = []
    threads = _start_silent(client, silent_endpoint, errors)
    try:
        wait_for(
            lambda: _in_handshake() == MAX_CONCURRENT_HANDSHAKES,
            what=f"{MAX_CONCURRENT_HANDSHAKES} handshakes with the silent endpoint under way",
        )
    finally:
        _finish(threads, driver, close_first=True)
    assert len(errors) == MAX_CONCURRENT_HANDSHAKES, errors
    for exc in errors:
        assert isinstance(exc, ConnectionClosedError), repr(exc)
        # ours between waits, or the driver's own when the close lands inside one of its calls
        assert "driver was closed" in str(exc) or "driver is closed" in str(exc), repr(exc)

"""The stream server steps its own media driver (invoker mode, issue 31): no driver thread, the
loop's one select over the transport's sockets, every wake-up of the loop ending it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import Driver, DriverConfig


def _config(tmp_path: Path, **kw: object) -> ServerConfig:
    return ServerConfig(directory=str(tmp_path / "srv"), port=0, term_length=1 << 20, **kw)  # type: ignore[arg-type]


def _threads_started_by(start: object) -> set[str]:
    before = set(threading.enumerate())
    start()  # type: ignore[operator]
    return {t.name for t in set(threading.enumerate()) - before}


def test_the_server_has_no_driver_thread_and_serves_sessions(tmp_path: Path) -> None:
    """Issue 31: the server ran two busy threads, its driver's and its loop, handing the
    interpreter lock between them several times a request (futex 6.7 a publish, and a wake-up
    byte to the driver for each reply). Its loop now steps the driver: starting it starts the
    loop's thread and no driver thread, and sessions are served (a publish, a read back, a
    second client) through the one thread."""
    server = StreamServer(_config(tmp_path, encryption=False))
    started = _threads_started_by(server.start)
    try:
        assert "aeron-spark-server" in started
        assert not any("driver" in name for name in started), started
        settings = ClientSettings(endpoint=server.endpoint, encryption=False)
        with StreamClient.connect(settings) as first, StreamClient.connect(settings) as second:
            for i in range(20):
                first.publish(7, [b"m%d" % i])
            streams = {s["stream_id"]: s for s in second.list_streams()}
            assert 7 in streams
        snapshot = server.snapshot()
        assert snapshot["counters"]["sessions_opened"] == 2
        assert snapshot["counters"]["sessions_expired"] == 0
    finally:
        server.close()
    assert server.failure is None


def test_shared_threading_stays_available_and_the_field_is_validated(tmp_path: Path) -> None:
    """``ServerConfig.driver_threading="shared"`` runs the driver on its thread as before;
    anything else than the two modes is refused by name."""
    with pytest.raises(ConfigurationError, match="driver_threading"):
        _config(tmp_path, driver_threading="dedicated")
    server = StreamServer(_config(tmp_path, encryption=False, driver_threading="shared"))
    started = _threads_started_by(server.start)
    try:
        assert "aeron-driver" in started
        settings = ClientSettings(endpoint=server.endpoint, encryption=False)
        with StreamClient.connect(settings) as client:
            client.publish(3, [b"x"])
            assert 3 in {s["stream_id"] for s in client.list_streams()}
    finally:
        server.close()
    assert server.failure is None


def test_an_invokers_idle_ends_for_a_wake_from_another_thread_and_never_loses_one() -> None:
    """The protocol the server's wake-ups rely on (commit worker, SIGHUP, stop, stat): a
    thread sets its condition, then calls ``Driver.wake()``; the invoker's ``idle(timeout,
    ready)`` asks ``ready`` once it counts as asleep. A condition set before the idle returns
    at once (True), one set during the select ends it through the wake-up byte: each of 200
    rounds ends long before its 30 s timeout, whichever way the threads interleave."""
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False)).start()
    try:
        flag = threading.Event()
        assert driver.idle(30.0, lambda: True) is True  # ready before it slept
        for i in range(200):
            flag.clear()
            driver.do_work()

            def waker(late: bool) -> None:
                if late:
                    time.sleep(0.001)  # half the rounds: while it sleeps in the select
                flag.set()
                driver.wake()

            thread = threading.Thread(target=waker, args=(i % 2 == 1,))
            started = time.monotonic()
            thread.start()
            while not flag.is_set():
                driver.idle(30.0, flag.is_set)
                if time.monotonic() - started > 25.0:
                    break
            thread.join(10.0)
            assert flag.is_set(), f"round {i}: the wake-up was lost"
            assert time.monotonic() - started < 25.0, f"round {i}: slept through the wake-up"
    finally:
        driver.close()

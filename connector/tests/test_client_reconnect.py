"""The client rides through a restart of its stream server (issue 30): a real server process is
killed with SIGKILL and started again on the same ports and data directory; every call, replay,
stage and commit of a client that was using it goes on where it was, each row exactly once.

On the old code each of these failed about 5 s after the kill (``ServerUnavailableError: the
session ... was closed by the server or lost``), although the server was back after 1 s.

The clients run over a driver of their own with the shortest transport timeouts a driver takes
(``DRIVER``: a session is seen lost 2 s after the server's last status message instead of 5 s,
its reply image gone after 4 s instead of 10 s) and try each new session for 2 s
(``connect_attempt_timeout_s``, 5 s by default): the same restarts, found and ridden through
sooner.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.server.testing import messages_of
from aeron_spark.connector.testing_restart import RestartableServer
from aeron_spark.counters import REGISTRY, CounterType
from aeron_spark.transport import Driver, DriverConfig

STREAM = 10
DRIVER = DriverConfig(
    write_counters_file=False,
    publication_connection_timeout_ns=2_000_000_000,
    image_liveness_timeout_ns=4_000_000_000,
)
ATTEMPT_S = 2.0  # each new session's handshake


@pytest.fixture(scope="module")
def driver() -> Iterator[Driver]:
    with Driver(DRIVER) as d:
        yield d


def _settings(endpoint: str, timeout_s: float = 30.0, **kw: Any) -> ClientSettings:
    return ClientSettings(
        endpoint=endpoint,
        encryption=False,
        timeout_s=timeout_s,
        connect_attempt_timeout_s=ATTEMPT_S,
        **kw,
    )


def _client(endpoint: str, driver: Driver, timeout_s: float = 30.0) -> StreamClient:
    return StreamClient.connect(_settings(endpoint, timeout_s=timeout_s), driver)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RestartableServer]:
    with RestartableServer(str(tmp_path / "server")) as srv:
        yield srv


def _payloads(n: int, size: int = 1000) -> list[bytes]:
    return [i.to_bytes(8, "big") * (size // 8) for i in range(n)]


def test_a_request_waiting_on_a_killed_server_is_sent_again_on_a_new_session(
    server: RestartableServer, driver: Driver
) -> None:
    with _client(server.endpoint, driver) as client:
        client.publish(STREAM, _payloads(10))
        before = client.list_recordings([STREAM])
        server.restart_later(1.0)
        after = client.list_recordings([STREAM])  # the session seen lost ~2 s after the kill
        assert client.reconnects >= 1
    assert [r.recorded_position for r in after] == [r.recorded_position for r in before]


def test_a_replay_resumes_at_the_last_delivered_position(
    server: RestartableServer, driver: Driver
) -> None:
    count = 12_000  # 12 MB: more than the session's window, so the kill stops it halfway
    with _client(server.endpoint, driver) as client:
        client.publish(STREAM, _payloads(count))
        (rec,) = client.list_recordings([STREAM])
        blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
        got = [next(blocks)]
        server.restart_later(1.0)
        got.extend(blocks)
        assert client.replay_resumes == 1
    positions = [(b.position, b.end_position) for b in got]
    assert all(a[1] == b[0] for a, b in zip(positions, positions[1:], strict=False))
    messages = messages_of(got, rec.initial_term_id, rec.term_length)
    assert [m.payload for m in messages] == _payloads(count)


@pytest.mark.parametrize("local", [False, True], ids=["over-session", "local-part"])
def test_a_part_staged_across_a_restart_is_committed_once(
    server: RestartableServer, driver: Driver, local: bool
) -> None:
    """The server is killed while the task stages its part (over the session: between
    requests; local: before ``local_stage_done``): the part is staged again on a new session,
    then committed; a commit repeated after another restart appends nothing."""
    count = 3000
    rows = _payloads(count)

    def payloads() -> Iterator[bytes]:
        for i, payload in enumerate(rows):
            if i == (count // 2 if not local else count - 1):
                server.restart_later(1.0)
            yield payload

    with _client(server.endpoint, driver) as client:
        client.settings = _settings(server.endpoint, max_request_bytes=64 * 1024)
        receipt = client.stage("sink-a", 7, 0, 0, STREAM, payloads(), local=local)
        assert client.restages == 1
        assert client.local_stages == (2 if local else 0)
        server.wait_restarted()
        result = client.commit("sink-a", 7, STREAM, [receipt])
        assert result["count"] == count
        server.restart_later(1.0)
        again = client.commit("sink-a", 7, STREAM, [receipt])  # the driver's retry
        assert again == result
        (rec,) = client.list_recordings([STREAM])
        assert rec.recorded_position == result["end_position"]
        blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
        messages = messages_of(blocks, rec.initial_term_id, rec.term_length)
    assert [m.payload for m in messages] == rows


def test_a_client_connects_to_a_server_that_comes_up_within_its_timeout(
    server: RestartableServer, driver: Driver
) -> None:
    """The producer CLI's case: the server is down when the client starts."""
    server.restart_later(2.0)
    with _client(server.endpoint, driver) as client:
        assert client.list_recordings([STREAM]) == []


def test_a_publish_interrupted_by_a_restart_says_it_was_not_sent_again(
    server: RestartableServer, driver: Driver
) -> None:
    """A publish is never resent (it may be recorded already): a clear error, and the same
    client goes on publishing on a new session."""

    def payloads() -> Iterator[bytes]:
        for i, payload in enumerate(_payloads(4000)):
            if i == 2000:
                server.restart_later(1.0)
            yield payload

    with _client(server.endpoint, driver) as client:
        client.settings = _settings(server.endpoint, max_request_bytes=64 * 1024)
        with pytest.raises(ServerUnavailableError, match="a publish is not sent again"):
            client.publish(STREAM, payloads())
        server.wait_restarted()
        assert client.publish(STREAM, _payloads(3)) > 0
        assert client.reconnects == 1


def test_a_server_that_stays_away_is_a_clear_error_after_the_timeout(
    server: RestartableServer, driver: Driver
) -> None:
    with _client(server.endpoint, driver, timeout_s=3.0) as client:
        client.publish(STREAM, _payloads(1))
        server.kill()
        with pytest.raises(ServerUnavailableError, match=r"within 3\.0 s"):
            client.list_recordings([STREAM])


def test_reconnects_and_their_retries_are_registry_counters(
    server: RestartableServer, driver: Driver
) -> None:
    """``reconnects`` and ``reconnect_retries`` are the client's registry counters (CLIENT),
    read with every other client counter by ``client_counters()`` (they were attributes of the
    client alone). The server is away 20 s: longer than finding the session lost (its reply
    stream's liveness, up to ~10 s) and a first reconnect attempt (5 s) together, so that
    attempt fails and is retried (away 10 s, a loss found late let the first attempt succeed
    with the server back: 0 retries, the rehearsal's failure)."""
    assert REGISTRY.is_declared(CounterType.CLIENT, "reconnect_retries")
    with _client(server.endpoint, driver, timeout_s=60.0) as client:
        client.publish(STREAM, _payloads(1))
        server.restart_later(8.0)
        client.list_recordings([STREAM])
        counters = client.client_counters()
        assert counters["reconnects"] == client.reconnects == 1, counters
        assert counters["reconnect_retries"] == client.reconnect_retries >= 1, counters
        assert set(counters) == {d.name for d in REGISTRY.of_type(CounterType.CLIENT)}


def test_the_handshake_clients_refusals_show_with_the_client_counters(
    server: RestartableServer, driver: Driver
) -> None:
    """The process's handshake client counters (a connect that waited out its slot, a key
    store's lock given up) are read with the client's own (they were attributes nobody read:
    ``handshake/tests/test_client_counters.py`` counts them)."""
    from aeron_spark.handshake.client_counters import handshake_client_counters

    with _client(server.endpoint, driver) as client:
        counters = client.client_counters()
    process = handshake_client_counters()
    assert set(process) == {"slot_timeouts", "key_store_lock_timeouts"}
    for name, value in process.items():
        assert counters[name] == value, counters
    assert set(counters) == {d.name for d in REGISTRY.of_type(CounterType.CLIENT)}

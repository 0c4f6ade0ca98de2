"""A running query rides through a restart of its stream server and through a network
partition (issue 30): nothing fails, every row is written exactly once.

One query copies a stream into another on the same server (so it reads and writes through the
same outage) with ``timeoutMs`` 30 s. The server is a real process (``aeron-spark server``):
killed with SIGKILL and started again on the same ports and data directory after 1 s and after
10 s; or, in a network namespace behind a veth pair, cut off by nftables (100 % loss) for 20 s.
On the old code the query failed about 5 s after the kill or the cut, in ``latestOffset``
(``ServerUnavailableError: the session ... was closed by the server or lost``), in a task's
``local_stage_done`` or in the driver's commit.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import messages_of
from aeron_spark.connector.testing_restart import RestartableServer
from aeron_spark.transport.testing_netns import LossyLink, unavailable_reason

pytestmark = pytest.mark.spark

SRC, DST = 70, 71
CHUNK = 100


def _client(endpoint: str) -> StreamClient:
    return StreamClient.connect(ClientSettings(endpoint=endpoint, encryption=False))


def _publish(endpoint: str, tag: str) -> list[bytes]:
    payloads = [f"{tag}{i:05d}".encode() for i in range(CHUNK)]
    with _client(endpoint) as client:
        client.publish(SRC, payloads)
    return payloads


def _written(endpoint: str) -> list[bytes]:
    """Every message of the destination stream (committed ones: the server shows no more)."""
    out: list[bytes] = []
    with _client(endpoint) as client:
        for rec in client.list_recordings([DST]):
            if rec.recorded_position > rec.start_position:
                blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
                out.extend(
                    m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)
                )
    return out


def _start_copy(spark, endpoint: str, ckpt: Path, local: bool):  # type: ignore[no-untyped-def]
    common = {"endpoint": endpoint, "encryption": "false", "timeoutMs": "30000"}
    source = (
        spark.readStream.format("aeron")
        .options(**common)
        .option("streamId", SRC)
        .option("localReads", str(local).lower())
        .load()
    )
    return (
        source.select("value")
        .writeStream.format("aeron")
        .options(**common)
        .option("localWrites", str(local).lower())
        .option("streamId", DST)
        .option("sinkId", "ride-through")
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="250 milliseconds")
        .start()
    )


def _wait_written(query, endpoint: str, count: int, timeout_s: float = 120.0) -> list[bytes]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive:
        got = _written(endpoint)
        if len(got) >= count:
            return got
        time.sleep(0.5)
    assert query.exception() is None, str(query.exception())[-3000:]
    raise AssertionError(f"the query wrote {len(_written(endpoint))} of {count} rows in time")


def _ride_through(spark, endpoint: str, ckpt: Path, outages, local: bool = True) -> None:  # type: ignore[no-untyped-def]
    """Copy a chunk; then for each outage: publish a chunk and start the outage (the query is
    planning or running its batch meanwhile), publish another once it is over and wait for
    both. Every chunk arrives, each row once."""
    expected = _publish(endpoint, "a")
    query = _start_copy(spark, endpoint, ckpt, local)
    try:
        _wait_written(query, endpoint, CHUNK)
        for n, outage in enumerate(outages):
            expected += _publish(endpoint, f"b{n}")
            outage()
            expected += _publish(endpoint, f"c{n}")
            got = _wait_written(query, endpoint, len(expected))
            assert query.exception() is None and query.isActive
    finally:
        query.stop()
    assert sorted(got) == sorted(expected)  # every row, none twice


def test_a_query_rides_through_server_restarts(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The server killed and back after 1 s, then killed and back after 10 s."""
    with RestartableServer(str(tmp_path / "server")) as server:

        def restart_after(down_s: float):  # type: ignore[no-untyped-def]
            def outage() -> None:
                server.restart_later(down_s)
                server.wait_restarted()

            return outage

        outages = [restart_after(1.0), restart_after(10.0)]
        _ride_through(spark, server.endpoint, tmp_path / "ckpt", outages)


netns_reason = unavailable_reason()


@pytest.mark.skipif(netns_reason is not None, reason=netns_reason or "")
def test_a_query_rides_through_a_20_s_partition(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The server on another host (network namespace); the link drops every packet for 20 s.
    Reads and writes go over the sessions (no local files), so the data path is cut too."""
    with LossyLink() as link:
        prefix = ["ip", "netns", "exec", str(link.b.netns)]
        with RestartableServer(str(tmp_path / "server"), link.b.address, prefix=prefix) as server:

            def outage() -> None:
                link.set_loss(100)
                time.sleep(20)
                link.set_loss(0)

            _ride_through(
                spark,
                server.endpoint,
                tmp_path / "ckpt",
                [outage],
                local=False,
            )

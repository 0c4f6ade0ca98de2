"""Failures: tasks that fail on their first attempt, and a server that goes away mid-query and
comes back. Results stay exactly once throughout."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.transport.testing import free_udp_port

pytestmark = pytest.mark.spark


def publish(endpoint: str, stream_id: int, payloads: list[bytes]) -> None:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(stream_id, payloads)


def read_all(spark, endpoint: str, stream_id: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    df = spark.read.format("aeron").option("endpoint", endpoint).option("streamId", stream_id)
    return sorted(bytes(r.value) for r in df.load().select("value").collect())


@F.udf(BinaryType())
def fail_first_attempt(value):  # type: ignore[no-untyped-def]  (no hints: a plain row UDF)
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0 and ctx.partitionId() == 0:
        raise RuntimeError("injected failure on the first attempt")
    return value


def _stream_copy(spark, endpoint: str, src: int, dst: int, ckpt: Path, fail: bool, **opts):  # type: ignore[no-untyped-def]
    df = spark.readStream.format("aeron").option("endpoint", endpoint).option("streamId", src)
    for key, value in opts.items():
        df = df.option(key, value)
    values = df.load().select("value")
    if fail:
        values = values.select(fail_first_attempt("value").alias("value"))
    query = (
        values.writeStream.format("aeron")
        .option("endpoint", endpoint)
        .option("streamId", dst)
        .option("sinkId", f"copy-{src}-{dst}")
        .option("checkpointLocation", str(ckpt))
        .options(**opts)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
    except StreamingQueryException:
        pass  # the caller looks at query.exception()
    return query


def test_tasks_failing_on_their_first_attempt_change_nothing(spark, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    payloads = [b"t%05d" % i for i in range(3000)]
    publish(server.endpoint, 40, payloads[:1500])
    publish(server.endpoint, 40, payloads[1500:])  # two recordings, so two read tasks
    query = _stream_copy(spark, server.endpoint, 40, 41, tmp_path / "ckpt", fail=True)
    assert query.exception() is None
    assert read_all(spark, server.endpoint, 41) == payloads


def test_server_going_away_fails_clearly_and_the_query_recovers_after_restart(
    spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = ServerConfig(
        directory=str(tmp_path / "srv"), port=free_udp_port(), term_length=1 << 20, mtu=8192
    )
    ckpt = tmp_path / "ckpt"
    with StreamServer(config).start() as server:
        endpoint = server.endpoint
        publish(endpoint, 50, [b"a%04d" % i for i in range(500)])
        # a run that must succeed: a bound for a loaded machine (it ends when the run does)
        query = _stream_copy(spark, endpoint, 50, 51, ckpt, fail=False, timeoutMs="30000")
        assert query.exception() is None
    # The server is down: the next run fails and says why.
    query = _stream_copy(spark, endpoint, 50, 51, ckpt, fail=False, timeoutMs="3000")
    error = str(query.exception())
    assert "HANDSHAKE_TIMEOUT" in error and "no server answers" in error, error[-2000:]
    # Back on the same port and directory: the query continues from its checkpoint.
    with StreamServer(config).start() as server:
        publish(endpoint, 50, [b"b%04d" % i for i in range(500)])
        query = _stream_copy(spark, endpoint, 50, 51, ckpt, fail=False, timeoutMs="30000")
        assert query.exception() is None
        expected = sorted([b"a%04d" % i for i in range(500)] + [b"b%04d" % i for i in range(500)])
        assert read_all(spark, endpoint, 51) == expected

"""Raw mode: the sink publishes straight to an Aeron channel that a plain subscription reads."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


class Collector:
    """A plain subscription on a free loopback port, polled on a thread."""

    def __init__(self, sub) -> None:  # type: ignore[no-untyped-def]
        self.sub = sub
        self.port = sub.local_endpoints[0][1]
        self.received: list[tuple[int, bytes, int]] = []
        self._assembler = FragmentAssembler(
            lambda payload, header: self.received.append(
                (header.session_id, bytes(payload), header.reserved_value)
            )
        )

    def poll_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.sub.poll(self._assembler, 100) == 0:
                self.sub.wait(0.05)

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:  # ends when they came
        deadline = time.monotonic() + timeout_s  # tasks return once their data was sent
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def values(self) -> list[bytes]:
        return sorted(v for _, v, _ in self.received)


@contextlib.contextmanager
def collector(stream_id: int) -> Iterator[Collector]:
    with Driver(DriverConfig(write_counters_file=False)) as driver:
        c = Collector(driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", stream_id))
        stop = threading.Event()
        poller = threading.Thread(target=c.poll_until, args=(stop,), daemon=True)
        poller.start()
        try:
            yield c
        finally:
            stop.set()
            poller.join(5)


def test_raw_mode_batch_write_reaches_a_plain_subscription(spark) -> None:  # type: ignore[no-untyped-def]
    with collector(66) as c:
        df = (
            spark.range(3000)
            .selectExpr("cast(concat('raw-', id) as binary) as value", "id * 2 as reserved_value")
            .repartition(3)
        )
        (
            df.write.format("aeron")
            .option("channel", f"aeron:udp?endpoint=127.0.0.1:{c.port}")
            .option("streamId", 66)
            .option("timeoutMs", 20000)
            .mode("append")
            .save()
        )
        c.wait_for(3000)
    assert c.values == sorted(f"raw-{i}".encode() for i in range(3000))
    assert all(rv == 2 * int(v[4:]) for _, v, rv in c.received)
    assert len({s for s, _, _ in c.received}) == 3  # one publisher session per task


def test_raw_mode_bad_channel_and_no_subscriber(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(3).selectExpr("cast(cast(id as string) as binary) as value")
    with raises_project(ConfigurationError, "invalid channel"):
        df.write.format("aeron").option("channel", "aeron:udp?endpoint=nohost").option(
            "streamId", 1
        ).mode("append").save()
    with raises_project(ServerUnavailableError, "no subscriber"):
        df.write.format("aeron").option("channel", "aeron:udp?endpoint=127.0.0.1:9").option(
            "streamId", 1
        ).option("timeoutMs", 1000).mode("append").save()


def test_raw_mode_streaming_copy_from_the_server_to_a_plain_subscription(  # type: ignore[no-untyped-def]
    spark, server, tmp_path
) -> None:
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(67, [b"s%04d" % i for i in range(500)])
    with collector(68) as c:
        query = (
            spark.readStream.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 67)
            .load()
            .select("value")
            .writeStream.format("aeron")
            .option("channel", f"aeron:udp?endpoint=127.0.0.1:{c.port}")
            .option("streamId", 68)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300) and query.exception() is None
        c.wait_for(500)
    assert c.values == [b"s%04d" % i for i in range(500)]

"""Raw mode: the sink publishes straight to an Aeron channel that a plain subscription reads."""

from __future__ import annotations

import threading
import time

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler

pytestmark = pytest.mark.spark


def test_raw_mode_batch_write_reaches_a_plain_subscription(spark) -> None:  # type: ignore[no-untyped-def]
    received: list[tuple[int, bytes, int]] = []
    stop = threading.Event()
    with Driver(DriverConfig(write_counters_file=False)) as driver:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 66)
        port = sub.local_endpoints[0][1]
        assembler = FragmentAssembler(
            lambda payload, header: received.append(
                (header.session_id, bytes(payload), header.reserved_value)
            )
        )

        def poll() -> None:
            while not stop.is_set():
                if sub.poll(assembler, 100) == 0:
                    sub.wait(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        df = spark.range(3000).selectExpr(
            "cast(concat('raw-', id) as binary) as value", "id * 2 as reserved_value"
        ).repartition(3)
        (
            df.write.format("aeron")
            .option("channel", f"aeron:udp?endpoint=127.0.0.1:{port}")
            .option("streamId", 66)
            .option("timeoutMs", 20000)
            .mode("append")
            .save()
        )
        for _ in range(200):  # the task returned once its data was sent; delivery is immediate
            if len(received) >= 3000:
                break
            time.sleep(0.05)
        stop.set()
        poller.join(5)
    values = sorted(v for _, v, _ in received)
    assert values == sorted(f"raw-{i}".encode() for i in range(3000))
    assert all(rv == 2 * int(v[4:]) for _, v, rv in received)
    assert len({s for s, _, _ in received}) == 3  # one publisher session per task


def test_raw_mode_bad_channel_and_no_subscriber(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(3).selectExpr("cast(id as string) as value").selectExpr(
        "cast(value as binary) as value"
    )
    with pytest.raises(Exception, match="invalid channel"):
        df.write.format("aeron").option("channel", "aeron:udp?endpoint=nohost").option(
            "streamId", 1
        ).mode("append").save()
    with pytest.raises(Exception, match="no subscriber"):
        df.write.format("aeron").option("channel", "aeron:udp?endpoint=127.0.0.1:9").option(
            "streamId", 1
        ).option("timeoutMs", 1000).mode("append").save()


def test_raw_mode_streaming_copy_from_the_server_to_a_plain_subscription(  # type: ignore[no-untyped-def]
    spark, server, tmp_path
) -> None:
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(67, [b"s%04d" % i for i in range(500)])
    received: list[bytes] = []
    with Driver(DriverConfig(write_counters_file=False)) as driver:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 68)
        port = sub.local_endpoints[0][1]
        assembler = FragmentAssembler(lambda payload, header: received.append(bytes(payload)))
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                if sub.poll(assembler, 100) == 0:
                    sub.wait(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        query = (
            spark.readStream.format("aeron").option("endpoint", server.endpoint)
            .option("streamId", 67).load().select("value")
            .writeStream.format("aeron")
            .option("channel", f"aeron:udp?endpoint=127.0.0.1:{port}")
            .option("streamId", 68)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300) and query.exception() is None
        for _ in range(200):
            if len(received) >= 500:
                break
            time.sleep(0.05)
        stop.set()
        poller.join(5)
    assert sorted(received) == [b"s%04d" % i for i in range(500)]

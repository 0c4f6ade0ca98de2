"""One source reading the same stream from several servers (endpoint=a:1,b:2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


def publish(endpoint: str, payloads: list[bytes]) -> None:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        client.publish(90, payloads)


def _recording_id(endpoint: str) -> int:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        return client.list_recordings([90])[0].recording_id


def test_streaming_read_from_two_servers_exactly_once_across_runs(spark, server, tmp_path: Path):  # type: ignore[no-untyped-def]
    with StreamServer(
        ServerConfig(directory=str(tmp_path / "second"), port=0, term_length=1 << 20)
    ).start() as second:
        endpoints = f"{server.endpoint},{second.endpoint}"
        publish(server.endpoint, [b"a%04d" % i for i in range(300)])
        publish(second.endpoint, [b"b%04d" % i for i in range(200)])

        def run() -> list[bytes]:
            query = (
                spark.readStream.format("aeron")
                .option("endpoint", endpoints)
                .option("streamId", 90)
                .option("maxMessagesPerTrigger", 150)
                .load()
                .select("value")
                .writeStream.format("parquet")
                .option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(300) and query.exception() is None
            out = spark.read.parquet(str(tmp_path / "out")).collect()
            return sorted(bytes(r.value) for r in out)

        first = [b"a%04d" % i for i in range(300)] + [b"b%04d" % i for i in range(200)]
        assert run() == sorted(first)
        publish(second.endpoint, [b"c%04d" % i for i in range(100)])
        expected = sorted(
            [b"a%04d" % i for i in range(300)]
            + [b"b%04d" % i for i in range(200)]
            + [b"c%04d" % i for i in range(100)]
        )
        assert run() == expected
        offsets = sorted((tmp_path / "ckpt" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
        last = json.loads(offsets[-1].read_text().splitlines()[-1])
        assert {key.rpartition("/")[0] for key in last} == {server.endpoint, second.endpoint}


def test_batch_read_from_two_servers_with_per_server_ending_positions(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    with StreamServer(
        ServerConfig(directory=str(tmp_path / "second"), port=0, term_length=1 << 20)
    ).start() as second:
        publish(server.endpoint, [b"x%03d" % i for i in range(10)])
        publish(second.endpoint, [b"y%03d" % i for i in range(10)])
        df = (
            spark.read.format("aeron")
            .option("endpoint", f"{server.endpoint},{second.endpoint}")
            .option("streamId", 90)
            .load()
        )
        rows = df.select("value", "recording_id").collect()
        assert sorted(bytes(r.value) for r in rows) == sorted(
            [b"x%03d" % i for i in range(10)] + [b"y%03d" % i for i in range(10)]
        )
        first_rid, second_rid = (_recording_id(e) for e in (server.endpoint, second.endpoint))
        ending = {f"{server.endpoint}/{first_rid}": 640, f"{second.endpoint}/{second_rid}": 192}
        part = (
            spark.read.format("aeron")
            .option("endpoint", f"{server.endpoint},{second.endpoint}")
            .option("streamId", 90)
            .option("endingPositions", json.dumps(ending))
            .load()
        )
        assert sorted(bytes(r.value) for r in part.select("value").collect()) == sorted(
            [b"x%03d" % i for i in range(10)] + [b"y%03d" % i for i in range(3)]
        )  # 64-byte frames: 640 = all ten, 192 = the first three
        with raises_project(ConfigurationError, "distinct"):
            spark.read.format("aeron").option(
                "endpoint", f"{server.endpoint},{server.endpoint}"
            ).option("streamId", 90).load().collect()

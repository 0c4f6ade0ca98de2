"""Lag of a streaming query (issue 32 item 5). PySpark 4.3 gives a Python streaming source no
metrics hook (``sources[0].metrics`` stays ``{}``), so lag is what README gives: per recording,
``latestOffset[r] - endOffset[r]`` bytes, and ``aeron-spark stat`` shows each consumerId's."""

from __future__ import annotations

import io
import json

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import stat_main

pytestmark = pytest.mark.spark


def test_lag_from_progress_offsets_and_in_stat(spark, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(50, [b"m%05d" % i for i in range(1000)])
        (rec,) = client.list_recordings(stream_ids=[50])
    frame = (rec.recorded_position - rec.start_position) // 1000
    df = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 50)
        .option("consumerId", "lagging")
        .option("maxMessagesPerTrigger", 300)
        .load()
    )
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300)
    assert query.exception() is None
    first = query.recentProgress[0]["sources"][0]
    assert first["metrics"] == {}  # no hook for a Python source: hence the formula
    latest, end = json.loads(first["latestOffset"]), json.loads(first["endOffset"])
    key = str(rec.recording_id)
    assert latest[key] - end[key] == 700 * frame  # the README's formula: bytes behind

    ends = {json.loads(p["sources"][0]["endOffset"])[key] for p in query.recentProgress}
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(50, [b"n%05d" % i for i in range(10)])
        (consumer,) = client.stats()["consumers"]
        recorded = client.list_recordings(stream_ids=[50])[0].recorded_position
    # Spark commits a batch's end to the source when it starts the next one: the consumer's
    # position is one of the query's batch ends, and stat shows how far the recording is past it.
    committed = consumer["positions"][key]
    assert committed in ends
    out = io.StringIO()
    assert stat_main(["--endpoint", server.endpoint, "--once"], out=out) == 0
    (row,) = [line.split() for line in out.getvalue().splitlines() if "lagging" in line]
    assert row[1] == key and row[4] == f"{recorded - committed:,}"
    assert recorded - committed >= 10 * frame

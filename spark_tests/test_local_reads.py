"""``localReads``: tasks that see the server's directory read their ranges from its segment files;
the rows are the ones a replay over the session gives, in batch and streaming reads and every
format."""

from __future__ import annotations

import pyarrow as pa
import pytest
from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.formats_arrow import encode_batches
from chispa import assert_df_equality

from aeron_spark.errors import ConfigurationError

pytestmark = pytest.mark.spark


def _counters(endpoint: str) -> dict[str, int]:
    with StreamClient.connect(ClientSettings(endpoint=endpoint)) as client:
        counters = client.stats()["counters"]
    return {k: counters[k] for k in ("local_reads_offered", "replays_started")}


def _read(spark, endpoint: str, stream_id: int, local: str, **options: str):  # type: ignore[no-untyped-def]
    reader = (spark.read.format("aeron").option("endpoint", endpoint).option("streamId", stream_id)
              .option("localReads", local).option("minPartitions", "3"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_local_and_replayed_reads_give_the_same_rows(spark, server, tmp_path):  # type: ignore[no-untyped-def]
    ep = server.endpoint
    with StreamClient.connect(ClientSettings(endpoint=ep)) as client:
        for part in range(4):  # several appends: several time-index entries per recording
            client.publish(40, [b"m-%d-%05d" % (part, i) + bytes(i % 300) for i in range(3000)],
                           reserved_values=range(3000))
        table = pa.table({"id": list(range(20_000)), "name": [f"n{i}" for i in range(20_000)]})
        client.publish(41, [m for b in table.to_batches(4096) for m in encode_batches(b, 30_000)])

    before = _counters(ep)
    local = _read(spark, ep, 40, "true")
    replayed = _read(spark, ep, 40, "false")
    assert_df_equality(local, replayed, ignore_row_order=True)  # timestamps included
    assert local.count() == 12_000
    middle = _counters(ep)
    assert middle["local_reads_offered"] > before["local_reads_offered"]

    arrow = {"format": "arrow", "schema": "id long, name string"}
    assert_df_equality(_read(spark, ep, 41, "true", **arrow), _read(spark, ep, 41, "false", **arrow),
                       ignore_row_order=True)

    # a streaming query (micro-batches of at most 5,000 messages) reads the same rows
    q = (spark.readStream.format("aeron").option("endpoint", ep).option("streamId", 40)
         .option("maxMessagesPerTrigger", "5000").load()
         .writeStream.format("memory").queryName("local_reads_stream")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(300) and q.exception() is None
    assert_df_equality(spark.sql("SELECT * FROM local_reads_stream"), replayed,
                       ignore_row_order=True, ignore_nullable=True)

    # localReads=false never asks where the files are
    after = _counters(ep)
    _read(spark, ep, 40, "false").count()
    final = _counters(ep)
    assert final["local_reads_offered"] == after["local_reads_offered"]
    assert final["replays_started"] > after["replays_started"]


def test_local_reads_option_is_checked(spark, server):  # type: ignore[no-untyped-def]
    from aeron_spark.connector.options import parse_source_options

    assert parse_source_options({"streamId": "1"}).local_reads
    assert not parse_source_options({"streamId": "1", "localReads": "false"}).local_reads
    with pytest.raises(ConfigurationError, match="localReads"):
        parse_source_options({"streamId": "1", "localReads": "sometimes"})
    with pytest.raises(Exception, match="localReads"):
        _read(spark, server.endpoint, 1, "sometimes").collect()

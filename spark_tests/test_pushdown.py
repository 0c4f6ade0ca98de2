"""Filter pushdown and Kafka's remaining source options on local Spark (issue 32 items 1, 6)."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.options import parse_source_options
from aeron_spark.connector.source import AeronBatchReader, AeronFilteringBatchReader

pytestmark = pytest.mark.spark

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def publish_rounds(endpoint: str, stream_id: int, rounds: int, per_round: int) -> None:
    """Three sessions (three recordings), ``rounds`` batches each, a pause between rounds so
    the time index tells them apart."""
    clients = [StreamClient.connect(ClientSettings(endpoint=endpoint)) for _ in range(3)]
    try:
        for r in range(rounds):
            for s, client in enumerate(clients):
                client.publish(stream_id, [b"s%d-r%d-%04d" % (s, r, i) for i in range(per_round)])
            time.sleep(0.05)
    finally:
        for client in clients:
            client.close()


def _load(spark, endpoint: str, stream_id: int, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("aeron").option("endpoint", endpoint).option("streamId", stream_id)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _rows(df) -> list:  # type: ignore[no-untyped-def]
    return sorted(df.collect(), key=lambda r: (r.recording_id, r.position))


def _with_pushdown(spark, enabled: bool, build):  # type: ignore[no-untyped-def]
    old = spark.conf.get(PUSHDOWN, "false")
    spark.conf.set(PUSHDOWN, "true" if enabled else "false")
    try:
        df = build()
        return _rows(df), df.rdd.getNumPartitions()
    finally:
        spark.conf.set(PUSHDOWN, old)


def test_pushed_filters_give_the_same_rows_and_read_fewer(spark, server) -> None:  # type: ignore[no-untyped-def]
    publish_rounds(server.endpoint, 40, rounds=4, per_round=500)
    every = _rows(_load(spark, server.endpoint, 40))
    assert len(every) == 6000
    rec = every[0].recording_id
    mine = [r for r in every if r.recording_id == rec]
    pos = mine[1200].position  # a message start inside round 2
    ts = mine[1000].timestamp  # round 2's first message's recorded time
    other = sorted({r.recording_id for r in every} - {rec})[0]

    def build():  # type: ignore[no-untyped-def]
        df = _load(spark, server.endpoint, 40, maxPartitionBytes="1")  # a recording a partition
        return df.filter(
            (F.col("recording_id").isin(rec, other))
            & (F.col("position") >= pos)
            & (F.col("timestamp") >= F.lit(ts))
            & (F.col("value") != b"nothing")  # not pushable: Spark keeps it
        )

    pushed, pushed_parts = _with_pushdown(spark, True, build)
    plain, plain_parts = _with_pushdown(spark, False, build)
    assert pushed == plain  # row for row
    assert [r.value for r in pushed if r.recording_id == rec][0].endswith(b"r2-0200")
    assert (pushed_parts, plain_parts) == (2, 3)  # recording_id IN dropped the third recording

    # What was read: the reader Spark runs, told the same filters, cuts each range.
    options = parse_source_options(
        {"endpoint": server.endpoint, "streamId": "40", "maxPartitionBytes": "1"}
    )
    reader = AeronFilteringBatchReader(options)
    filters = [In(("recording_id",), (rec, other)), GreaterThanOrEqual(("position",), pos)]
    assert list(reader.pushFilters(filters)) == filters  # all still applied by Spark
    parts = {p.recording_id: p for p in reader.partitions()}
    assert set(parts) == {rec, other}
    assert parts[rec].start == pos
    full = {p.recording_id: p for p in AeronBatchReader(options).partitions()}
    read = sum(p.end - p.start for p in parts.values())
    assert read < sum(p.end - p.start for p in full.values()) / 2


def test_pushdown_time_and_position_upper_bounds_and_equality(spark, server) -> None:  # type: ignore[no-untyped-def]
    publish_rounds(server.endpoint, 41, rounds=3, per_round=200)
    every = _rows(_load(spark, server.endpoint, 41))
    rec = every[0].recording_id
    mine = [r for r in every if r.recording_id == rec]
    ts = mine[400].timestamp  # round 2's first
    pos = mine[100].position
    session = mine[0].session_id
    cases = [
        lambda df: df.filter(F.col("timestamp") < F.lit(ts)),
        lambda df: df.filter(F.col("timestamp") <= F.lit(ts)),
        lambda df: df.filter(F.col("position") <= pos),
        lambda df: df.filter(F.col("position") == pos),
        lambda df: df.filter(F.col("position") > pos),
        lambda df: df.filter((F.col("session_id") == session) & (F.col("stream_id") == 41)),
        lambda df: df.filter(F.col("position") == pos + 1),  # no message starts there
    ]
    for case in cases:
        pushed, _ = _with_pushdown(spark, True, lambda c=case: c(_load(spark, server.endpoint, 41)))
        plain, _ = _with_pushdown(spark, False, lambda c=case: c(_load(spark, server.endpoint, 41)))
        assert pushed == plain

    options = parse_source_options({"endpoint": server.endpoint, "streamId": "41"})
    reader = AeronFilteringBatchReader(options)
    reader.pushFilters([EqualTo(("recording_id",), rec), LessThan(("position",), pos)])
    (part,) = reader.partitions()
    assert (part.recording_id, part.end) == (rec, pos)

    reader = AeronFilteringBatchReader(options)
    after = ts.astimezone(dt.UTC)  # Spark hands timestamp literals as aware datetimes
    reader.pushFilters([EqualTo(("recording_id",), rec), GreaterThanOrEqual(("timestamp",), after)])
    (part,) = reader.partitions()
    assert part.start == mine[400].position  # through the time index: round 2's first message


def test_ending_timestamp_and_starting_positions_by_timestamp(spark, server) -> None:  # type: ignore[no-untyped-def]
    publish_rounds(server.endpoint, 42, rounds=3, per_round=100)
    every = _rows(_load(spark, server.endpoint, 42))
    recs = sorted({r.recording_id for r in every})
    first = {rid: [r for r in every if r.recording_id == rid] for rid in recs}
    round2_ms = {rid: _ms(rows[100]) for rid, rows in first.items()}
    # Round 2 starts at least 50 ms after round 1's messages: a ms boundary between them.
    cut = max(round2_ms.values())
    ended = _rows(_load(spark, server.endpoint, 42, endingTimestamp=str(cut)))
    assert ended == [r for r in every if _ms(r) < cut]
    assert {r.value[3:5] for r in ended} >= {b"r0"}

    round3 = _ms(first[recs[0]][200])
    by_ts = f'{{"{recs[0]}": {round3}}}'
    started = _rows(_load(spark, server.endpoint, 42, startingPositionsByTimestamp=by_ts))
    assert started == [r for r in every if r.recording_id != recs[0] or _ms(r) >= round3]
    assert [r.value[3:5] for r in started if r.recording_id == recs[0]] == [b"r2"] * 100


def _ms(row) -> int:  # type: ignore[no-untyped-def]
    """A row's recorded time in whole epoch milliseconds (rounded down)."""
    return round(row.timestamp.timestamp() * 1_000_000) // 1000  # naive: local time


def test_a_position_bound_inside_a_fragmented_message_is_not_used(spark, server) -> None:  # type: ignore[no-untyped-def]
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(43, [b"small", b"B" * 20_000, b"after"])  # mtu 8192: 3 fragments
    rows = _rows(_load(spark, server.endpoint, 43))
    big, after = rows[1], rows[2]
    middle = big.position + 8192  # the second fragment's frame: no message starts there
    assert middle < after.position

    def build():  # type: ignore[no-untyped-def]
        return _load(spark, server.endpoint, 43).filter(F.col("position") >= middle)

    pushed, _ = _with_pushdown(spark, True, build)
    plain, _ = _with_pushdown(spark, False, build)
    assert pushed == plain == [after]
    options = parse_source_options({"endpoint": server.endpoint, "streamId": "43"})
    reader = AeronFilteringBatchReader(options)
    reader.pushFilters([GreaterThanOrEqual(("position",), middle)])
    (part,) = reader.partitions()
    assert part.start == rows[0].position  # not cut there (a read from it would fail)

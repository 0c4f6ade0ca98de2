"""Reads of an ingest recording while a fragmented message is coming in (no crash).

An ingest recording holds frames as the publisher sent them: while a large message arrives a
window at a time, the recorded end lies inside it. The source took that end as the end of what
may be read: a batch read of the stream then failed ("the replayed range ends inside a
fragmented message") for as long as the message was incomplete, and a streaming query started
at ``startingPositions=latest`` began inside the message and failed for good ("starts inside a
fragmented message"). The server now lists each recording's last message boundary with it
(``message_end``, as ``recording_positions`` does), and the source reads up to it. Likewise a
query started at ``startingTimestamp`` began where the time index pointed, which in an ingest
recording may be inside a message (its blocks are indexed as they come); ``position_at`` now
answers the next message boundary.
"""

from __future__ import annotations

import time

import pytest

from aeron_spark.connector.server.testing import server_process
from aeron_spark.transport import Driver, DriverConfig
from connector.tests.test_server_ingest_tail_recovery import (
    AFTER,
    STREAM,
    WHOLE,
    _batch_read,
    _ingest_channel,
    _options,
    _send_torn,
    _wait_recorded,
)


@pytest.mark.slow
def test_reads_of_an_ingest_recording_stop_before_a_message_still_coming_in(tmp_path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from aeron_spark.connector.options import parse_source_options
    from aeron_spark.connector.source import AeronStreamReader

    channel, extra = _ingest_channel()
    with (
        Driver(DriverConfig()) as driver,
        server_process(str(tmp_path / "srv"), extra) as (_proc, endpoint),
    ):
        pub = driver.add_publication(channel, STREAM)
        _first, rest = _send_torn(pub, endpoint)

        assert _batch_read(endpoint) == WHOLE  # main: ends inside a fragmented message
        after_first = time.time_ns() // 1_000_000 + 1  # ms: after the first fragments' time
        reader = AeronStreamReader(
            parse_source_options({**_options(endpoint), "startingPositions": "latest"})
        )
        start = reader.initialOffset()

        time.sleep(0.01)  # the rest is recorded (and indexed) after ``after_first``
        pub.offer_block_blocking(rest, timeout_s=60.0)
        for message in AFTER:
            pub.offer_blocking(message, timeout_s=60.0)
        _wait_recorded(endpoint, pub.position, 1)
        end = reader.latestOffset(start, ReadAllAvailable())
        seen: list[bytes] = []
        for partition in reader.partitions(start, end):  # main: starts inside a message
            for batch in reader.read(partition):
                seen += batch.column("value").to_pylist()
        torn = b"T" * 200_000
        assert seen == [torn, *AFTER], [len(m) for m in seen]
        assert _batch_read(endpoint) == [*WHOLE, torn, *AFTER]
        # from a time after the torn message's first position: its messages from the next one
        # on (main: the time index pointed inside the message, where the rest was appended)
        reader = AeronStreamReader(
            parse_source_options({**_options(endpoint), "startingTimestamp": str(after_first)})
        )
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        seen = []
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                seen += batch.column("value").to_pylist()
        assert seen == AFTER, [len(m) for m in seen]
        pub.close()

"""A packed input partition reads all its ranges with one request to the stream server (issue 31
item 2: each of a packed partition's ranges was its own ``local_read`` or ``replay`` request, a
round trip through the server's loop a recording), with the rows one request a range gave, in the
same order, the same again on a re-read; an older server gets a request a range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import PositionOutOfRangeError
from aeron_spark.connector.options import parse_source_options
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.session import protocol as proto
from aeron_spark.connector.source import AeronBatchReader, PackedRanges, ranges_of, read_range

STREAM = 21
RECORDINGS = 12


@pytest.fixture
def server(tmp_path: Path):
    config = ServerConfig(
        directory=str(tmp_path / "srv"),
        port=0,
        term_length=64 * 1024,
        mtu=1408,
        max_block_bytes=8192,
    )
    with StreamServer(config).start() as srv:
        for n in range(RECORDINGS):  # one recording per session; fragmented messages too
            with StreamClient.connect(ClientSettings(endpoint=srv.endpoint)) as publisher:
                publisher.publish(
                    STREAM, [b"r%02d-%03d" % (n, i) * (1 + (i * 97) % 900) for i in range(30 + n)]
                )
        yield srv


def _packed(server: StreamServer, **options: str) -> PackedRanges:
    reader = AeronBatchReader(
        parse_source_options(
            {
                "endpoint": server.endpoint,
                "streamId": str(STREAM),
                "encryption": "false",
                "maxPartitionBytes": str(1 << 30),
                **options,
            }
        )
    )
    (partition,) = reader.partitions()
    assert isinstance(partition, PackedRanges)
    assert len(partition.ranges) == RECORDINGS
    return partition


def _rows(partition: Any) -> list[tuple[Any, ...]]:
    return [
        (r["recording_id"], r["position"], r["value"], r["timestamp"])
        for batch in read_range(partition)
        for r in batch.to_pylist()
    ]


def _requests(server: StreamServer) -> dict[str, int]:
    counters = server.snapshot()["counters"]
    return {k: int(counters[k]) for k in ("requests", "local_reads_offered", "replays_started")}


def _read_counted(server: StreamServer, partition: Any) -> tuple[list[tuple[Any, ...]], dict]:
    before = _requests(server)
    rows = _rows(partition)
    after = _requests(server)
    return rows, {k: after[k] - before[k] for k in after}


def _one_range_at_a_time(server: StreamServer, partition: PackedRanges) -> list[tuple[Any, ...]]:
    rows = []
    for part in ranges_of(partition):
        got, asked = _read_counted(server, part)
        assert asked["requests"] == 1  # a local_read or a replay
        rows.extend(got)
    return rows


@pytest.mark.parametrize("local", [True, False])
def test_a_packed_partition_reads_its_ranges_with_one_request(server, local: bool) -> None:
    partition = _packed(server, localReads=str(local).lower())
    expected = _one_range_at_a_time(server, partition)
    assert len(expected) == sum(30 + n for n in range(RECORDINGS))
    in_order = list(dict.fromkeys(r[0] for r in expected))  # range by range, as packed
    assert in_order == [p.recording_id for p in partition.ranges]
    rows, asked = _read_counted(server, partition)
    assert rows == expected  # the same rows in the same order
    if local:
        assert asked == {"requests": 1, "local_reads_offered": RECORDINGS, "replays_started": 0}
    else:
        assert asked == {"requests": 1, "local_reads_offered": 0, "replays_started": 1}
    again, asked_again = _read_counted(server, partition)
    assert again == expected and asked_again == asked  # a re-run task: the same rows


def test_a_server_before_the_ranges_requests_is_read_a_request_a_range(
    server, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = _packed(server)
    remote = _packed(server, localReads="false")
    expected = _one_range_at_a_time(server, partition)
    for op in ("local_read_ranges", "replay_ranges"):  # the server answers "unknown operation"
        monkeypatch.delitem(proto.OPS, op)
    rows, asked = _read_counted(server, partition)
    assert rows == expected
    assert asked["requests"] == 1 + RECORDINGS  # the refused one, then a local_read each
    assert asked["local_reads_offered"] == RECORDINGS
    rows, asked = _read_counted(server, remote)
    assert rows == expected
    assert asked["requests"] == 1 + RECORDINGS and asked["replays_started"] == RECORDINGS


def test_a_replay_of_ranges_checks_every_range_before_sending_anything(server) -> None:
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        recs = sorted(client.recording_positions([STREAM]).items())
        (rid, p0), (rid2, p1) = recs[0], recs[1]
        before = _requests(server)["replays_started"]
        with pytest.raises(PositionOutOfRangeError):
            client.read_ranges(
                [(rid, 0, p0.message_end), (rid2, 0, p1.message_end + 64)], local=False
            )
        assert _requests(server)["replays_started"] == before
        # empty ranges give no blocks and keep the order; an iterator left unread is skipped
        ranges = [(rid, 0, 0), (rid, 0, p0.message_end), (rid2, 0, 0), (rid2, 0, p1.message_end)]
        got = [list(blocks) for blocks in client.read_ranges(ranges, local=False)]
        assert [len(b) > 1 for b in got] == [False, True, False, True]
        assert got[1][0].position == 0 and got[1][-1].end_position == p0.message_end
        assert got[3][0].position == 0 and got[3][-1].end_position == p1.message_end
        each = client.read_ranges(ranges[1:], local=False)
        next(each)  # not read
        next(each)
        assert [b.position for b in next(each)] == [b.position for b in got[3]]
        assert next(each, None) is None
        assert client.list_recordings([STREAM])  # the session is clean for the next call

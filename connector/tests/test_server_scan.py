"""The server's scan: message boundaries, limits and splits over real recordings."""

from __future__ import annotations

from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ConnectorError
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import messages_of


@pytest.fixture
def server(tmp_path: Path):
    config = ServerConfig(directory=str(tmp_path / "srv"), port=0, term_length=64 * 1024, mtu=1408)
    with StreamServer(config).start() as srv:
        yield srv


def _recording(client: StreamClient, stream_id: int) -> tuple[int, int, int]:
    (rec,) = client.list_recordings([stream_id])
    return rec.recording_id, rec.recorded_position, rec.initial_term_id


def _payloads(client: StreamClient, rid: int, itid: int, start: int, end: int) -> list[bytes]:
    return [m.payload for m in messages_of(client.replay(rid, start, end), itid, 64 * 1024)]


def test_limits_end_on_message_boundaries_and_count_whole_messages(server) -> None:
    sizes = [10, 5000, 100, 8000, 7, 3000] * 20  # fragmented ones too (mtu 1408)
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(3, [bytes([i % 251]) * n for i, n in enumerate(sizes)])
        rid, end, itid = _recording(client, 3)
        everything = client.scan(rid, 0)
        assert everything.end == end and everything.messages == len(sizes)
        position, seen = 0, 0
        while position < end:
            step = client.scan(rid, position, max_messages=7)
            assert 0 < step.messages <= 7
            got = _payloads(client, rid, itid, position, step.end)
            assert [len(m) for m in got] == sizes[seen : seen + step.messages]
            seen += step.messages
            position = step.end
        assert seen == len(sizes)
        small = client.scan(rid, 0, max_bytes=6000)
        assert small.messages == 3 and small.end <= 6000  # 10 B, 5000 B, 100 B framed fit
        assert client.scan(rid, 0, max_messages=4).end > 6000  # the 8000 B one would not
        one = client.scan(rid, 0, max_bytes=1)
        assert one.messages == 1  # always progress by at least one whole message


def test_splits_cut_a_range_into_parts_of_equal_message_counts(server) -> None:
    with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
        client.publish(4, [b"m%04d" % i for i in range(1000)])
        rid, end, itid = _recording(client, 4)
        result = client.scan(rid, 0, parts=4)
        assert len(result.splits) == 3 and list(result.splits) == sorted(set(result.splits))
        bounds = [0, *result.splits, end]
        counts = [
            len(_payloads(client, rid, itid, a, b))
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        assert counts == [250, 250, 250, 250]
        assert client.scan(rid, 0, end=bounds[1], parts=1000).messages == 250
        with pytest.raises(ConnectorError, match="parts"):
            client.scan(rid, 0, parts=5000)

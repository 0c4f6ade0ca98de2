"""Recording through the server and replaying by position, over real loopback sessions."""

from __future__ import annotations

import random
import threading

import pytest

from aeron_spark.connector.client import StreamClient
from aeron_spark.connector.errors import (
    NotFrameBoundaryError,
    PositionOutOfRangeError,
    PurgedError,
    UnknownRecordingError,
)
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import client_for, messages_of

STREAM = 10


@pytest.fixture
def server(tmp_path):
    config = ServerConfig(
        directory=str(tmp_path / "srv"), port=0, encryption=False, term_length=1024 * 1024, mtu=4096
    )
    with StreamServer(config) as srv:
        yield srv


def _replay_messages(client: StreamClient, rec, start: int, end: int | None):
    return messages_of(
        client.replay(rec.recording_id, start, end), rec.initial_term_id, rec.term_length
    )


def test_concurrent_publishers_record_and_replay_byte_identical(server) -> None:
    publishers, per_publisher = 4, 25_000  # 100,000 messages in all
    rng = random.Random(11)
    sent: dict[int, list[bytes]] = {
        p: [
            f"p{p}-{i}-".encode() + rng.randbytes(rng.randrange(0, 120))
            for i in range(per_publisher)
        ]
        for p in range(publishers)
    }
    ends: dict[int, int] = {}
    failures: list[BaseException] = []

    def publish(p: int) -> None:
        try:
            with client_for(server.endpoint) as c:
                ends[p] = c.publish(STREAM, sent[p], reserved_values=range(per_publisher))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=publish, args=(p,)) for p in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not failures, failures
    with client_for(server.endpoint) as c:
        recs = c.list_recordings(stream_ids=[STREAM])
        assert len(recs) == publishers
        assert sorted(r.recorded_position for r in recs) == sorted(ends.values())
        latest = c.latest_positions([STREAM])
        assert latest == {r.recording_id: r.recorded_position for r in recs}
        by_first: dict[int, tuple] = {}
        for rec in recs:
            msgs = _replay_messages(c, rec, rec.start_position, rec.recorded_position)
            p = int(msgs[0].payload.split(b"-")[0][1:])
            by_first[p] = (rec, msgs)
            assert [m.payload for m in msgs] == sent[p]
            assert [m.reserved_value for m in msgs] == list(range(per_publisher))
            assert msgs[-1].end_position <= rec.recorded_position
        # arbitrary ranges between message boundaries give exactly the messages in between
        for rec, msgs in by_first.values():
            for _ in range(5):
                i, j = sorted(rng.sample(range(len(msgs) + 1), 2))
                start = msgs[i].position if i < len(msgs) else rec.recorded_position
                end = msgs[j].position if j < len(msgs) else rec.recorded_position
                got = _replay_messages(c, rec, start, end)
                assert got == msgs[i:j]


def test_live_replay_follows_a_growing_recording(server) -> None:
    with client_for(server.endpoint) as producer, client_for(server.endpoint) as reader:
        producer.publish(STREAM, [b"first"])
        (rec,) = reader.list_recordings([STREAM])
        blocks = reader.replay(rec.recording_id, rec.start_position, None)
        seen: list[bytes] = []
        expected = [b"first"] + [f"m{i}".encode() for i in range(500)]
        batches = iter(range(0, 500, 100))
        for block in blocks:
            seen += [m.payload for m in messages_of([block], rec.initial_term_id, rec.term_length)]
            if len(seen) == len(expected):
                break
            nxt = next(batches, None)
            if nxt is not None:
                producer.publish(STREAM, expected[1 + nxt : 1 + nxt + 100])
        blocks.close()  # stops the live replay on the server
        assert seen == expected
        # the session still works after stopping a live replay
        assert reader.latest_positions([STREAM])[rec.recording_id] > rec.recorded_position


def test_replay_inside_a_frame_is_refused_with_nearest_boundaries(server) -> None:
    with client_for(server.endpoint) as c:
        c.publish(STREAM, [b"a" * 100, b"b" * 100])  # frames of 160 bytes each
        (rec,) = c.list_recordings([STREAM])
        with pytest.raises(NotFrameBoundaryError) as info:
            c.replay(rec.recording_id, rec.start_position + 64, None)
        assert (info.value.before, info.value.after) == (
            rec.start_position,
            rec.start_position + 160,
        )
        with pytest.raises(NotFrameBoundaryError):
            c.replay(rec.recording_id, rec.start_position, rec.start_position + 100)
        with pytest.raises(PositionOutOfRangeError):
            c.replay(rec.recording_id, rec.start_position, rec.recorded_position + 32)
        with pytest.raises(UnknownRecordingError):
            c.replay(rec.recording_id + 1000, 0, None)
        # and the session is still usable
        msgs = _replay_messages(c, rec, rec.start_position, rec.recorded_position)
        assert [m.payload for m in msgs] == [b"a" * 100, b"b" * 100]


def test_purge_then_replay_of_the_purged_range_is_purged_error(server) -> None:
    with client_for(server.endpoint) as c:
        c.publish(STREAM, [bytes([i % 256]) * 1000 for i in range(3000)])  # ~3 MiB, 3 terms
        (rec,) = c.list_recordings([STREAM])
        msgs = _replay_messages(c, rec, rec.start_position, rec.recorded_position)
        cut = msgs[2000].position
        purged = c.purge(rec.recording_id, cut)
        assert rec.start_position < purged <= cut
        (after,) = c.list_recordings([STREAM])
        assert after.purged_position == purged
        with pytest.raises(PurgedError) as info:
            list(c.replay(rec.recording_id, rec.start_position, cut))
        assert info.value.purged_position == purged
        tail = _replay_messages(c, rec, cut, rec.recorded_position)
        assert tail == msgs[2000:]


def test_position_at_finds_the_first_message_at_or_after_a_time(server) -> None:
    import time

    with client_for(server.endpoint) as c:
        before = time.time_ns()
        c.publish(STREAM, [b"early"] * 10)
        time.sleep(0.02)
        middle = time.time_ns()
        time.sleep(0.02)
        c.publish(STREAM, [b"late"] * 10)
        (rec,) = c.list_recordings([STREAM])
        msgs = _replay_messages(c, rec, rec.start_position, rec.recorded_position)
        assert c.position_at(rec.recording_id, before) == rec.start_position
        assert c.position_at(rec.recording_id, middle) == msgs[10].position
        assert c.position_at(rec.recording_id, time.time_ns() + 10**9) == rec.recorded_position
        assert rec.start_timestamp_ns >= before

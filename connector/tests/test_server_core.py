"""The server core driven directly with bytes and a manual clock (no sockets, no threads)."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.connector.errors import ErrorCode
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import ServerCore
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto

MAX_MESSAGE = 64 * 1024
WALL_NS = 1_700_000_000_000_000_000  # the caller's wall clock (2023-11-14), manual like now_ns


@pytest.fixture
def core(tmp_path):
    config = ServerConfig(directory=str(tmp_path), port=0, session_lease_ns=1_000_000_000)
    store = ArchiveStore(config, driver=None)
    core = ServerCore(config, store, SinkCommitter(os.path.join(str(tmp_path), "sink"), store))
    yield core
    store.close()


def _reply(messages: list[bytes]) -> proto.Reply:
    (message,) = messages
    return proto.decode_reply(message)


def test_publish_then_bounded_replay_through_the_core(core) -> None:
    core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
    end = _reply(
        core.on_message(
            "a",
            proto.encode_request(1, "publish", {"stream_id": 5, "payloads": [b"x" * 100] * 1000}),
            1,
            WALL_NS,
        )
    ).result
    rid = _reply(
        core.on_message("a", proto.encode_request(2, "list_recordings", {}), 2, WALL_NS)
    ).result[0]["recording_id"]
    assert _reply(
        core.on_message(
            "a",
            proto.encode_request(3, "replay", {"recording_id": rid, "start": 0, "end": end}),
            3,
            WALL_NS,
        )
    ).ok
    out: list[bytes] = []
    while core.has_replays("a"):
        out += core.pump("a", 16 * 1024, 4)
    data = [proto.decode_replay_data(m) for m in out[:-1]]
    assert data[0][1] == 0 and data[-1][2] == end
    assert all(a[2] == b[1] for a, b in zip(data, data[1:], strict=False))  # contiguous
    assert all(len(m) <= MAX_MESSAGE for m in out)
    final = proto.decode_reply(out[-1])
    assert (final.id, final.event, final.result) == (3, "replay_end", {"position": end})


def test_idle_sessions_expire_and_their_replays_stop(core) -> None:
    core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
    core.open_session("b", "peer-b", MAX_MESSAGE, now_ns=0)
    core.on_message(
        "a", proto.encode_request(1, "publish", {"stream_id": 5, "payloads": [b"x"]}), 0, WALL_NS
    )
    core.on_message(
        "a", proto.encode_request(2, "replay", {"recording_id": 0, "start": 0}), 0, WALL_NS
    )
    assert core.has_replays("a")
    core.on_message("b", proto.encode_request(1, "keepalive", {}), 900_000_000, WALL_NS)
    assert core.expire(1_500_000_000) == ["a"]  # b renewed its lease, a did not
    assert not core.has_replays("a") and "b" in core.sessions
    assert core.counters["sessions_expired"] == 1


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.builds(lambda b: b"\x01" + b, st.binary(max_size=64)),
            st.builds(
                lambda d: b"\x01" + msgpack.packb(d),
                st.dictionaries(
                    st.sampled_from(["id", "op", "args", "x"]),
                    st.one_of(
                        st.integers(-5, 2**40),
                        st.text(max_size=8),
                        st.none(),
                        st.dictionaries(st.text(max_size=6), st.integers(-3, 3), max_size=3),
                    ),
                    max_size=4,
                ),
            ),
            st.builds(lambda b: bytes([chunking.KIND_CHUNK]) + b, st.binary(max_size=40)),
        ),
        max_size=8,
    )
)
def test_garbage_gets_typed_errors_and_never_disturbs_another_session(core, junk) -> None:
    core.open_session("bad", "peer-bad", MAX_MESSAGE, now_ns=0)
    core.open_session("good", "peer-good", MAX_MESSAGE, now_ns=0)
    for message in junk:
        for out in core.on_message("bad", message, 1, WALL_NS):
            reply = proto.decode_reply(out)
            if not reply.ok:
                assert reply.error["code"] in {int(c) for c in ErrorCode}
    good = _reply(core.on_message("good", proto.encode_request(7, "stats", {}), 2, WALL_NS))
    assert good.ok and good.id == 7
    assert core.counters["internal_errors"] == 0
    core.close_session("bad", 3)
    core.close_session("good", 3)


def test_the_wall_clock_of_consumer_commits_and_stats_is_the_callers(core) -> None:
    """Issue 18: the core reads no clock; a consumer's commit time and its age in the stats are
    the wall clock the caller passes (``wall_ns``), like ``now_ns`` for leases."""
    core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
    publish = {"stream_id": 5, "payloads": [b"x"]}  # the position's recording must exist
    assert _reply(core.on_message("a", proto.encode_request(9, "publish", publish), 1, WALL_NS)).ok
    rid = core.store.list_recordings({5})[0]["recording_id"]
    commit = {"consumer_id": "q1", "stream_ids": [5], "positions": [[rid, 64]]}
    assert _reply(
        core.on_message("a", proto.encode_request(1, "consumer_commit", commit), 1, WALL_NS)
    ).ok
    with open(core.consumers.path, "rb") as fh:  # persisted with the caller's time
        assert msgpack.unpackb(fh.read())["q1"]["updated_s"] == WALL_NS / 1e9
    later = WALL_NS + 90_000_000_000  # 90 s of the caller's wall clock; the monotonic one: 1 ns
    stats = _reply(core.on_message("a", proto.encode_request(2, "stats", {}), 2, later)).result
    assert [(c["consumer_id"], c["age_s"]) for c in stats["consumers"]] == [("q1", 90.0)]
    assert core.stats(3, WALL_NS + 5_000_000_000)["consumers"][0]["age_s"] == 5.0


def test_one_stream_operations_are_refused_outside_the_served_streams_and_read_only(
    tmp_path,
) -> None:
    """publish, stage, local_stage and local_stage_done have their one stream authorised with
    the operation (one ``_authorise`` call a publish): a stream the server does not serve is
    refused naming it, a read-only server refuses them all; nothing is written."""
    part = {"sink_id": "s", "batch_id": 0, "partition_id": 0, "attempt": 0}
    requests = [
        ("publish", {"payloads": [b"x"]}),
        ("stage", {**part, "payloads": [b"x"], "final": True}),
        ("local_stage", part),
        ("local_stage_done", {**part, "count": 1, "bytes": 1}),
    ]
    for read_only in (False, True):
        directory = str(tmp_path / f"read_only_{read_only}")
        config = ServerConfig(
            directory=directory,
            port=0,
            allowed_stream_ids=frozenset({5}),
            read_only=read_only,
            local_writes=True,
        )
        store = ArchiveStore(config, driver=None)
        core = ServerCore(config, store, SinkCommitter(os.path.join(directory, "sink"), store))
        try:
            core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
            for i, (op, args) in enumerate(requests):
                stream = 5 if read_only else 6
                message = proto.encode_request(i, op, {**args, "stream_id": stream})
                reply = _reply(core.on_message("a", message, 1, WALL_NS))
                assert not reply.ok and reply.error["code"] == int(ErrorCode.NOT_AUTHORISED)
                text = reply.error["message"]
                assert ("read-only" in text) if read_only else ("stream 6" in text), text
            assert core.counters["not_authorised"] == len(requests)
            assert store.list_recordings(None) == []
        finally:
            store.close()


def test_a_publish_with_one_payload_too_long_writes_none_of_them(tmp_path) -> None:
    """The payloads' lengths are checked once, before anything is framed (the longest
    decides): a publish whose third payload exceeds the stream's largest message (term_length
    / 8) is PAYLOAD_TOO_LARGE naming the longest, and none of its payloads is recorded; the
    session's next publish goes on at the same position."""
    config = ServerConfig(directory=str(tmp_path), port=0, term_length=64 * 1024)
    store = ArchiveStore(config, driver=None)
    core = ServerCore(config, store, SinkCommitter(os.path.join(str(tmp_path), "sink"), store))
    try:
        core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
        first = proto.encode_request(1, "publish", {"stream_id": 5, "payloads": [b"a" * 100]})
        end = _reply(core.on_message("a", first, 1, WALL_NS)).result
        payloads = [b"b" * 100, b"c" * 8192, b"d" * 9000, b"e" * 8193]
        refused = _reply(
            core.on_message(
                "a",
                proto.encode_request(2, "publish", {"stream_id": 5, "payloads": payloads}),
                2,
                WALL_NS,
            )
        )
        assert not refused.ok and refused.error["code"] == int(ErrorCode.PAYLOAD_TOO_LARGE)
        assert "9000 bytes" in refused.error["message"], refused.error
        assert core.counters["messages_published"] == 1
        assert len(store.list_recordings(None)) == 1
        last = proto.encode_request(3, "publish", {"stream_id": 5, "payloads": [b"f" * 100]})
        assert _reply(core.on_message("a", last, 3, WALL_NS)).result == 2 * end
    finally:
        store.close()

"""The server core driven directly with bytes and a manual clock (no sockets, no threads)."""

from __future__ import annotations

import os

import msgpack
import pytest
from aeron_spark.connector.errors import ErrorCode
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import ServerCore
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_MESSAGE = 64 * 1024


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
        )
    ).result
    rid = _reply(core.on_message("a", proto.encode_request(2, "list_recordings", {}), 2)).result[0][
        "recording_id"
    ]
    assert _reply(
        core.on_message(
            "a", proto.encode_request(3, "replay", {"recording_id": rid, "start": 0, "end": end}), 3
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
        "a", proto.encode_request(1, "publish", {"stream_id": 5, "payloads": [b"x"]}), 0
    )
    core.on_message("a", proto.encode_request(2, "replay", {"recording_id": 0, "start": 0}), 0)
    assert core.has_replays("a")
    core.on_message("b", proto.encode_request(1, "keepalive", {}), 900_000_000)
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
        for out in core.on_message("bad", message, 1):
            reply = proto.decode_reply(out)
            if not reply.ok:
                assert reply.error["code"] in {int(c) for c in ErrorCode}
    good = _reply(core.on_message("good", proto.encode_request(7, "stats", {}), 2))
    assert good.ok and good.id == 7
    assert core.counters["internal_errors"] == 0
    core.close_session("bad", 3)
    core.close_session("good", 3)

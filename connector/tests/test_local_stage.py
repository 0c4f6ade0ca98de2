"""Sink parts written by the task into the server's directory, against parts staged over the
session, through a real server on loopback."""

from __future__ import annotations

import os
import random

import pytest

from aeron_spark.connector.errors import (
    ControlProtocolError,
    NotAuthorisedError,
    PayloadTooLargeError,
    StagedDataMissingError,
)
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.store import LOCAL_READ_TOKEN
from aeron_spark.connector.server.testing import client_for, messages_of

STREAM = 20


def _server(tmp_path, **kw) -> StreamServer:
    return StreamServer(
        ServerConfig(
            directory=str(tmp_path / "srv"),
            port=0,
            encryption=False,
            term_length=1024 * 1024,
            mtu=4096,
            **kw,
        )
    )


def _payload_sets() -> dict[str, tuple[list[bytes], list[int] | None]]:
    rng = random.Random(7)
    mixed = [rng.randbytes(rng.choice([0, 3, 116, 700, 9000])) for _ in range(3000)]
    return {
        "equal rows": ([b"%0116d" % i for i in range(50_000)], list(range(50_000))),
        "mixed": (mixed, [rng.randrange(-(2**63), 2**63) for _ in mixed]),
        "large": ([rng.randbytes(60_000) for _ in range(150)], None),  # Arrow-message sized
        "none": ([], None),
    }


def _part_bytes(server: StreamServer, receipt: dict) -> bytes:
    path = server.core.committer.staging.part_path(receipt)
    with open(path, "rb") as fh:
        return fh.read()


@pytest.mark.parametrize("kind", list(_payload_sets()))
def test_a_part_written_locally_is_the_part_the_session_would_stage(tmp_path, kind) -> None:
    payloads, rvs = _payload_sets()[kind]
    with _server(tmp_path) as server, client_for(server.endpoint) as c:
        local = c.stage("q", 0, 0, 0, STREAM, iter(payloads), rvs)
        remote = c.stage("q", 0, 0, 1, STREAM, iter(payloads), rvs, local=False)
        assert c.local_stages == 1
        assert {k: v for k, v in local.items() if k not in ("attempt", "part")} == {
            k: v for k, v in remote.items() if k not in ("attempt", "part")
        }
        assert local["count"] == len(payloads) and local["bytes"] == sum(map(len, payloads))
        assert _part_bytes(server, local) == _part_bytes(server, remote)
        result = c.commit("q", 0, STREAM, [local])
        assert result["count"] == len(payloads)
        if payloads:
            (rec,) = c.list_recordings([STREAM])
            blocks = c.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            got = messages_of(blocks, rec.initial_term_id, rec.term_length)
            assert [m.payload for m in got] == payloads
            if rvs is not None:
                assert [m.reserved_value for m in got] == rvs
        counters = c.stats()["counters"]
        assert counters["sink_parts_staged_locally"] == 1
        assert counters["local_stages_offered"] == 1


def test_a_part_that_does_not_check_out_is_refused_and_deleted(tmp_path) -> None:
    base = {"sink_id": "q", "batch_id": 0, "partition_id": 0, "attempt": 0, "stream_id": STREAM}
    with _server(tmp_path) as server, client_for(server.endpoint) as c:
        for damage, match in [
            (b"\x10\x00\x00\x00" + bytes(8) + b"short", "ends inside a record"),
            (b"\x05\x00\x00\x00" + bytes(8) + b"12345", "holds 1 payloads of 5 bytes"),
        ]:
            where = c.call("local_stage", **base)
            with open(where["path"], "ab") as fh:
                fh.write(damage)
            with pytest.raises(StagedDataMissingError, match=match):
                c.call("local_stage_done", **base, count=2, bytes=10)
            assert not os.path.exists(where["path"])
            assert not os.path.exists(where["path"][: -len(".open")] + ".part")
        with pytest.raises(ControlProtocolError, match="ask local_stage first"):
            c.call("local_stage_done", **base, count=0, bytes=0)
        c.call("local_stage", **base)
        with pytest.raises(ControlProtocolError, match="stream_id"):
            c.call("local_stage_done", **dict(base, stream_id=STREAM + 1), count=0, bytes=0)
        # the server is still serving and nothing of these parts can be committed
        with pytest.raises(StagedDataMissingError):
            c.commit("q", 0, STREAM, [dict(base, part="0-0", count=1, bytes=5)])


def test_a_task_that_does_not_see_the_servers_files_stages_over_its_session(tmp_path) -> None:
    with _server(tmp_path) as server, client_for(server.endpoint) as c:
        with open(os.path.join(server.config.directory, LOCAL_READ_TOKEN), "w") as fh:
            fh.write("another host's token")
        # the server created the part for a local write; the session's stage recreates it
        receipt = c.stage("q", 0, 0, 0, STREAM, [b"a", b"bc"])
        assert c.local_stages == 0
        assert c.commit("q", 0, STREAM, [receipt])["count"] == 2
        assert c.stats()["counters"]["sink_parts_staged_locally"] == 0


def test_servers_that_refuse_local_writes(tmp_path) -> None:
    with _server(tmp_path, local_writes=False) as server, client_for(server.endpoint) as c:
        receipt = c.stage("q", 0, 0, 0, STREAM, [b"x"] * 10)
        assert c.local_stages == 0 and receipt["count"] == 10
        assert c.stats()["counters"]["local_stages_refused"] == 1
    with _server(tmp_path, read_only=True) as server, client_for(server.endpoint) as c:
        with pytest.raises(NotAuthorisedError, match="read-only"):
            c.stage("q", 0, 0, 0, STREAM, [b"x"])


def test_a_session_that_goes_away_after_local_stage_leaves_the_server_serving(tmp_path) -> None:
    base = {"sink_id": "q", "batch_id": 3, "partition_id": 1, "attempt": 0, "stream_id": STREAM}
    with _server(tmp_path, session_lease_ns=10**9) as server:
        with client_for(server.endpoint) as c:
            where = c.call("local_stage", **base)
        assert os.path.exists(where["path"])  # left for the staging lease's garbage collection
        with client_for(server.endpoint) as c:
            receipt = c.stage("q", 3, 1, 0, STREAM, [b"again"])
            assert c.commit("q", 3, STREAM, [receipt])["count"] == 1


@pytest.mark.parametrize("local", [True, False])
def test_a_message_larger_than_the_stream_allows_is_refused_when_staged(tmp_path, local) -> None:
    # term 1 MiB: at most 128 KiB a message; refused at stage time, before any commit begins
    with _server(tmp_path) as server, client_for(server.endpoint) as c:
        with pytest.raises(PayloadTooLargeError, match="131072"):
            c.stage("q", 0, 0, 0, STREAM, [b"ok", bytes(128 * 1024 + 1)], local=local)
        receipt = c.stage("q", 0, 0, 1, STREAM, [bytes(128 * 1024)], local=local)
        assert c.commit("q", 0, STREAM, [receipt])["count"] == 1

"""Deferred operations come back to the loop as effects (issue 18): the job a worker runs only
executes the request; counting and the reply happen in ``ServerCore.complete`` on the caller's
thread, so the core's counters and sessions have one writer."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from aeron_spark.connector.errors import ErrorCode, PurgedError
from aeron_spark.connector.server.authz import Authorizer
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import KeysReloaded, Outcome, ServerCore
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.stat import read_snapshot, render, write_snapshot
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import protocol as proto
from aeron_spark.errors import ConfigurationError

MAX_MESSAGE = 64 * 1024


@pytest.fixture
def core(tmp_path):  # type: ignore[no-untyped-def]
    config = ServerConfig(directory=str(tmp_path), port=0, session_lease_ns=1_000_000_000)
    store = ArchiveStore(config, driver=None)
    core = ServerCore(config, store, SinkCommitter(os.path.join(str(tmp_path), "sink"), store))
    yield core
    store.close()


def test_a_deferred_request_is_executed_by_the_job_and_counted_by_complete(core) -> None:  # type: ignore[no-untyped-def]
    jobs: list[tuple[object, Any]] = []
    core.defer = lambda key, job: jobs.append((key, job))
    core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
    assert (
        core.on_message(
            "a", proto.encode_request(1, "scan", {"recording_id": 77, "start": 0}), 1, 1
        )
        == []
    )
    ((key, job),) = jobs
    before = dict(core.counters)
    outcomes: list[Outcome] = []
    worker = threading.Thread(target=lambda: outcomes.append(job()))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    (outcome,) = outcomes
    assert key == "a" and outcome.key == "a" and outcome.error is not None
    assert dict(core.counters) == before  # the worker counted nothing
    reply = proto.decode_reply(core.complete(outcome))
    assert reply.id == 1 and not reply.ok
    assert reply.error["code"] == ErrorCode.UNKNOWN_RECORDING
    assert core.counters["request_errors"] == before["request_errors"] + 1


def test_complete_replies_ok_with_the_result_and_counts_nothing(core) -> None:  # type: ignore[no-untyped-def]
    core.open_session("a", "peer-a", MAX_MESSAGE, now_ns=0)
    session = core.sessions["a"]
    request = proto.Request(9, "scan", {})
    before = dict(core.counters)
    reply = proto.decode_reply(core.complete(Outcome("a", session, request, result={"end": 5})))
    assert reply.ok and reply.result == {"end": 5} and dict(core.counters) == before
    error = Outcome("a", session, request, error=PurgedError("gone", purged_position=64))
    failed = proto.decode_reply(core.complete(error))
    assert failed.error["code"] == ErrorCode.PURGED
    assert failed.error["details"]["purged_position"] == 64


def test_a_keys_reload_is_counted_and_its_revocations_closed_by_the_core(core, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The shell only reads the authorized keys file; what the reload gave comes back to the
    core as a :class:`KeysReloaded` effect, which counts it (through the registry) and closes
    the removed keys' sessions: the reload counters have one writer, the core."""
    keep, gone = bytes(range(32)), bytes(range(1, 33))
    path = tmp_path / "authorized_keys"
    path.write_text(f"{keep.hex()} keep read=*\n{gone.hex()} gone read=* write=*\n")
    core.authz = Authorizer(str(path))
    core.open_session("k", "peer-k", MAX_MESSAGE, now_ns=0, identity=keep)
    core.open_session("g", "peer-g", MAX_MESSAGE, now_ns=0, identity=gone)

    path.write_text(f"{keep.hex()} keep read=*\nnot a key line\n")  # the old table stays
    try:
        reload = KeysReloaded(removed=frozenset(core.authz.load()))
    except ConfigurationError as exc:
        reload = KeysReloaded(error=exc)
    assert reload.error is not None
    assert core.keys_reloaded(reload, 1) == [] and set(core.sessions) == {"k", "g"}

    path.write_text(f"{keep.hex()} keep read=*\n")
    reload = KeysReloaded(removed=frozenset(core.authz.load()))
    assert core.keys_reloaded(reload, 2) == ["g"] and set(core.sessions) == {"k"}
    # a handshake of the removed key that was in flight: refused when its session would open
    assert core.open_session("late", "peer-g", MAX_MESSAGE, now_ns=3, identity=gone) is None
    assert "late" not in core.sessions

    counters = core.stats(4, 5)["counters"]
    expected = {
        "authorized_keys_reloads": 1,
        "authorized_keys_reload_failures": 1,
        "sessions_revoked": 2,
        "sessions_closed": 1,
    }
    assert {name: counters[name] for name in expected} == expected
    # and as ``aeron-spark stat --dir`` shows them (the snapshot the server writes)
    write_snapshot(str(tmp_path), core.stats(4, 5))
    text = render(read_snapshot(str(tmp_path)))
    for name, value in expected.items():
        assert any(line.split() == [name, str(value)] for line in text.splitlines()), name

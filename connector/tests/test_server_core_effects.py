"""Deferred operations come back to the loop as effects (issue 18): the job a worker runs only
executes the request; counting and the reply happen in ``ServerCore.complete`` on the caller's
thread, so the core's counters and sessions have one writer."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from aeron_spark.connector.errors import ErrorCode, PurgedError
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import Outcome, ServerCore
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import protocol as proto

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

"""Attacks on ``consumers.msgpack`` written first (fifteenth session: the registry in memory
changes only once the file was replaced): ``consumer_commit`` runs on the server's commit worker
(a deferred operation), ``consumer_forget`` on its loop. Two clients doing each at the same time
must never lose one's change (in memory or in the file), tear the file, or get an error."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from aeron_spark.connector.server.testing import client_for, server_process

STREAM = 10


def _consumers(client: Any) -> dict[str, dict[Any, int]]:
    return {c["consumer_id"]: c["positions"] for c in client.stats()["consumers"]}


def test_consumer_commits_and_forgets_of_two_clients_at_once_lose_nothing(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "srv")
    errors: list[BaseException] = []
    rounds = 150
    with server_process(directory) as (proc, endpoint):
        with client_for(endpoint) as writer:
            writer.publish(STREAM, [b"m%d" % i for i in range(20)])
            [rec] = writer.list_recordings([STREAM])
        positions = [rec.start_position, rec.recorded_position]
        rid = rec.recording_id

        def committer() -> None:  # consumer "a": commits (the commit worker)
            try:
                with client_for(endpoint) as client:
                    for i in range(rounds):
                        client.consumer_commit("a", [STREAM], {rid: positions[i % 2]})
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def forgetter() -> None:  # consumer "b": committed, then forgotten (the loop)
            try:
                with client_for(endpoint) as client:
                    for _ in range(rounds):
                        client.consumer_commit("b", [STREAM], {rid: positions[0]})
                        assert client.consumer_forget("b")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=committer), threading.Thread(target=forgetter)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert not errors, errors[0]
        last = positions[(rounds - 1) % 2]
        with client_for(endpoint) as client:
            held = _consumers(client)
        assert set(held) == {"a"} and list(held["a"].values()) == [last], held
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    with server_process(directory) as (_proc, endpoint), client_for(endpoint) as client:
        held = _consumers(client)
    # main: the file held what the last writer of the two threads computed from the registry
    # without the other's change
    assert set(held) == {"a"} and list(held["a"].values()) == [last], held

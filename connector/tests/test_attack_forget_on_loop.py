"""Attack: ``consumer_forget`` wrote the whole consumers' file on the server's loop.

Every change of the consumer registry rewrites ``consumers.msgpack`` whole and fsyncs it (up to
``--max-consumer-positions`` positions, megabytes), one change at a time under the registry's
lock. ``consumer_commit`` does it on the commit worker, in its client's turn; ``consumer_forget``
did it on the server's loop, the thread that serves every session: a client creating consumers
and forgetting them had the loop write and fsync the file once a forget, and a forget that came
while the worker wrote a commit waited for that write's lock on the loop, every session's
traffic stalled meanwhile. Fixed: ``consumer_forget`` is a deferred operation (the commit
worker, the fair queue, the session's bound of 4 unanswered).

Counted, not timed: the loop thread's file write system calls (``/proc/self/task/<tid>/io``,
``syscw``: socket sends are not in it) across the forgets. A real in-process server, a real
session over loopback UDP, real files."""

from __future__ import annotations

from pathlib import Path

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer

FORGETS = 20


def _file_writes(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/io") as fh:
        fields = dict(line.split(": ") for line in fh.read().splitlines() if line)
    return int(fields["syscw"])


def test_attack_consumer_forgets_do_not_write_on_the_loop(tmp_path: Path) -> None:
    config = ServerConfig(directory=str(tmp_path / "s"), port=0, encryption=False)
    with (
        StreamServer(config) as server,
        StreamClient.connect(
            ClientSettings(endpoint=server.endpoint, encryption=False, timeout_s=60.0)
        ) as client,
    ):
        end = client.publish(10, [b"row"])
        rec = client.list_recordings([10])[0].recording_id
        for n in range(FORGETS):
            client.consumer_commit(f"q{n}", [10], {rec: end})
        assert server._thread is not None
        loop = server._thread.native_id
        assert loop is not None
        before = _file_writes(loop)
        for n in range(FORGETS):
            assert client.consumer_forget(f"q{n}")
        writes = _file_writes(loop) - before
        print(f"the loop's file writes across {FORGETS} forgets: {writes}")
        assert client.stats()["consumers"] == []
        # the file rewritten by the worker, not the loop (main: one write or more a forget)
        assert writes < FORGETS, writes

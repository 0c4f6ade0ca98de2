"""Many idle sessions under a low descriptor limit: the spares' open files, the file cache and the
sessions together must leave the server descriptors to serve with.

Each session that has not published wants a spare recording directory, and spares held their
four files open within the file cache's budget (a third of the limit) on top of the cache's own
third: at a limit of 48 that left the server nothing of its own (~23 descriptors), and publishes
failed with TOO_MANY_OPEN_FILES. The spares now hold only what the limit leaves beside the
cache, the dedicated sockets' eighth and the server's own (``spare_open_budget``). An
authorised client opening many sessions and publishing to many streams asks for both at once:
every request must succeed, and a newcomer must still connect and publish.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from aeron_spark.connector.server.testing import client_for, server_process

LIMIT = 48


def test_attack_many_idle_sessions_and_streams_leave_descriptors_to_serve_with(
    tmp_path: Path,
) -> None:
    with server_process(str(tmp_path / "srv"), nofile=(LIMIT, LIMIT)) as (proc, endpoint):
        with ExitStack() as idle, client_for(endpoint) as writer:
            for _ in range(48):  # sessions that never publish: a spare wanted for each
                idle.enter_context(client_for(endpoint))
            for s in range(100, 200):  # 100 recordings: 300 files through a cache of 42
                writer.publish(s, [b"%d" % s])
            with client_for(endpoint) as newcomer:
                newcomer.publish(999, [b"newcomer"])
            stats = writer.stats()
        assert proc.poll() is None
    print({k: v for k, v in stats["store"].items() if "open" in k or "spare" in k})
    print({k: v for k, v in stats["counters"].items() if "files" in k or "spare" in k})
    # before: TooManyOpenFilesError: publish failed: the server has no file descriptor left
    # (-1 open, limit 48, hard limit 48) (16 cached files, 16 of spares, 23 of its own)
    assert stats["counters"].get("too_many_open_files_errors", 0) == 0
    assert stats["store"]["spare_recordings_open_files"] == 0  # no room for them at 48

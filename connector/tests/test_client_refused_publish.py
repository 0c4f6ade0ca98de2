"""A publish the server refuses with an error reply raises that coded error at once.

What broke (d116fb8, issue 31's one-request publish): ``_publish_one`` handed the refused
request to ``_settle`` after ``_wait_reply`` had already taken its reply, and ``_settle``
waited for a second reply to it that never comes: every refused publish of a small list
(STORAGE_FULL on a full disk, ...) waited out the client's whole ``timeout_s`` before raising
the server's error. The full-disk tests waited 60 s per refused publish (three in one test).
The bound below is no timing of speed: it tells an answer from a timeout waited out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from aeron_spark.connector.errors import ConnectorError
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport.archive.testing import MountUnavailable, fill, small_tmpfs

STREAM = 5
STORAGE_FULL = 14
TIMEOUT_S = 40.0


@pytest.fixture
def tmpfs() -> Iterator[str]:
    try:
        with small_tmpfs(2 * 1024 * 1024) as path:
            yield path
    except MountUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
def test_a_refused_publish_raises_the_servers_coded_error_without_waiting_out_the_timeout(
    tmpfs: str,
) -> None:
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint, timeout_s=TIMEOUT_S) as c:
        c.publish(STREAM, [b"fits"])
        fill(tmpfs, leave_bytes=200_000)
        refusals = 0
        for _ in range(400):  # until refused (what the segment file holds still fits), twice:
            # the session stays clean, the next refused publish is answered the same
            began = time.monotonic()
            try:
                c.publish(STREAM, [b"m" * 1000] * 50)
            except ConnectorError as exc:
                waited = time.monotonic() - began
                assert exc.code == STORAGE_FULL, exc
                assert waited < TIMEOUT_S / 2, f"the refused publish waited {waited:.1f} s"
                refusals += 1
                if refusals == 2:
                    break
        assert refusals == 2, "the file system never filled up"
        assert c.stats()["counters"]["storage_full_errors"] >= 2
        assert proc.poll() is None

"""kill -9 of the primary archive during a streaming write with ``minInSyncReplicas=2`` (issue
30): no acknowledged batch lost, no row duplicated; the old primary restarted on its directory
is truncated back and re-seeded, and then every archive holds the same rows at the same
positions.

Three real ``ArchivingMediaDriver``s (``aeron_peer.archive_set``: sleeping idle strategies, free
loopback ports, stopped by the test). The query reads text files (one micro-batch per file, a
source that does not depend on the archives) and writes them with ``archive`` = the primary,
``replicas`` = the two others. The primary is killed while the query runs (between its batches:
a batch whose tasks staged on the primary before the kill cannot be committed and fails the query,
``docs/aeron-archive.md``); the next batches stage on a replica and commit on the promoted one.
The primary then restarts and the next batch re-seeds it. Skips without Java only; fails instead
with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import messages_on, read_rows  # noqa: E402

from aeron_spark.connector.options import (  # noqa: E402
    parse_archive_sink_options,
)
from aeron_spark.transport.testing import free_udp_port  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(900)]

STREAM_ID = 5301
ROWS = 20  # per file (micro-batch)
TIMEOUT_MS = 10_000  # each attempt to reach the dead primary costs this much


def _wait_rows(query, channel: str, count: int, timeout_s: float = 240.0) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Until the committed-only reader of ``channel`` reads ``count`` rows (bounded); fails
    at once with the query's error when it stopped."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not query.isActive:
            raise AssertionError(f"the query stopped: {query.exception()}")
        got = read_rows(channel, STREAM_ID)
        if len(got) >= count:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{channel}: {len(got)} of {count} rows in {timeout_s:g} s")
        time.sleep(0.5)


def test_kill_9_of_the_primary_during_a_streaming_write(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    aeron_peer.require_java()
    inbox = tmp_path / "in"
    inbox.mkdir()
    expected: list[bytes] = []

    def add_file(n: int) -> None:
        rows = [f"f{n}-row-{i:03d}" for i in range(ROWS)]
        part = inbox / f".part-{n}"
        part.write_text("".join(r + "\n" for r in rows))
        part.rename(inbox / f"file-{n:02d}.txt")  # whole, at once
        expected.extend(r.encode() for r in rows)

    # each archive on an address of its own, as on hosts of their own: a task stages on the
    # same port of whichever archive answers, and two archives on one address both wanted it
    # (the restarted primary's recording was refused while the promoted replica's lingered)
    hosts = {"w-a": ("127.0.0.1", ()), "w-b": ("127.0.0.2", ()), "w-c": ("127.0.0.3", ())}
    with aeron_peer.archive_set(
        tmp_path / "archives", [("w-a", 0x5E1), ("w-b", 0x5E2), ("w-c", 0x5E3)], hosts=hosts
    ) as archives:
        a, b, c = archives["w-a"], archives["w-b"], archives["w-c"]
        sink = {
            "archive": a.control_channel,
            "replicas": f"{b.control_channel},{c.control_channel}",
            "minInSyncReplicas": "2",
            # the same ports on each archive's address (free on all three)
            "channel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            "archiveStagingChannel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            "streamId": str(STREAM_ID),
            "sinkId": "failover-write",
            "timeoutMs": str(TIMEOUT_MS),
        }
        o = parse_archive_sink_options(sink)
        add_file(0)
        query = (
            spark.readStream.format("text")
            .option("maxFilesPerTrigger", 1)
            .load(str(inbox))
            .selectExpr("CAST(value AS BINARY) AS value")
            .writeStream.format("aeron")
            .options(**sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        try:
            _wait_rows(query, a.control_channel, ROWS)
            add_file(1)
            _wait_rows(query, b.control_channel, 2 * ROWS)  # acknowledged: on a replica too
            query.processAllAvailable()  # idle: its last commit over, nothing staged
            a.kill()  # kill -9 while the query runs
            add_file(2)
            add_file(3)
            _wait_rows(query, b.control_channel, 4 * ROWS)  # on the promoted replica
            restarted = a.restart_after_kill("w-a2")  # its stale mark file removed
            archives["w-a2"] = restarted  # stopped with the others
            add_file(4)
            for archive in (b, a, c):  # a: re-seeded by the commit that appended it on b
                _wait_rows(query, archive.control_channel, 5 * ROWS)
            query.processAllAvailable()
            assert query.exception() is None
        finally:
            query.stop()
        on_b = dataclasses.replace(o, connect=o.replicas[0])
        for archive in (a, b, c):
            got = read_rows(archive.control_channel, STREAM_ID)
            assert len(got) == len(set(got)), archive.control_channel  # nothing twice
            assert sorted(got) == sorted(expected), archive.control_channel  # nothing lost
        held = messages_on(on_b, b.control_channel)
        assert messages_on(on_b, a.control_channel) == held == messages_on(on_b, c.control_channel)

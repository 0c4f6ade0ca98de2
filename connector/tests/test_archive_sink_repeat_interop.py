"""A repeated commit of an acknowledged archive-sink batch never cuts it off (issue 30).

A commit with ``minInSyncReplicas=2`` that completed put the batch's END on the primary and a
replica: acknowledged (a batch write returned, a streaming commit completed). The same batch
committed again (a batch write re-run with the same ``batchId``, a streaming driver that died
before Spark logged the commit) finds the END on the primary, appends nothing and asks the
replicas for copies. If too few copies can be made now (the replica dies after answering), the
commit fails with NOT_ENOUGH_REPLICAS, but the batch must stay where it is: it was acknowledged
before this commit. On the old code the failed re-commit cut the batch off the primary (and off
every copy that held it), so losing the one replica then lost an acknowledged batch, and a
committed-only reader of the primary no longer saw it. Real Java archives; skips without Java
only (fails instead with ``AERON_INTEROP_REQUIRED``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from aeron_spark.connector.options import (
    parse_archive_sink_options,
)
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import KilledAfterConnect, commit_fails, read_rows, stage  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(400)]
STREAM_ID = 6401


def test_a_failed_repeated_commit_keeps_the_acknowledged_batch(tmp_path: Path) -> None:
    aeron_peer.require_java()
    with aeron_peer.java_archives(tmp_path, ["repeat-a", "repeat-b"], 0x5F1) as (a, b):
        o = parse_archive_sink_options(
            {
                "archive": a.control_channel,
                "replicas": b.control_channel,
                "minInSyncReplicas": "2",
                "channel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
                "streamId": str(STREAM_ID),
                "sinkId": "repeated",
                "timeoutMs": "10000",
            }
        )
        rows = [[b"r%d-%04d" % (n, i) for i in range(300)] for n in range(2)]
        for n in (0, 1):
            stats = archive_sink.commit_batch(o, "id", n, [stage(o, n, 0, rows[n])])
            assert (stats.appended_rows, stats.replicas_in_sync) == (300, 1)  # acknowledged
        assert read_rows(a, STREAM_ID) == rows[0] + rows[1] == read_rows(b, STREAM_ID)
        # batch 1 committed again; its only replica dies once it answered
        parts = [dataclasses.replace(stage(o, 1, 0, rows[1]), attempt=1)]
        replicas = KilledAfterConnect(o, "id")
        replicas.victim = b
        failed = commit_fails(o, 1, parts, replicas)
        assert "undone" not in str(failed.value)
        assert read_rows(a, STREAM_ID) == rows[0] + rows[1]  # the acknowledged batch is still there
        # with the replica gone for good, the same batch with minInSyncReplicas=1: nothing
        # appended, every row once
        o1 = dataclasses.replace(o, min_insync_replicas=1)
        stats = archive_sink.commit_batch(o1, "id", 1, [stage(o1, 1, 0, rows[1])])
        assert (stats.skipped_duplicate, stats.appended_rows) == (1, 0)
        assert read_rows(a, STREAM_ID) == rows[0] + rows[1]

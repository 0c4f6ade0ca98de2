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

import pyarrow as pa
import pytest

from aeron_spark.connector.errors import NotEnoughReplicasError
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_sink_options,
    parse_archive_source_options,
)
from aeron_spark.connector.source import AeronBatchReader
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.connector.stores.archive.replicas import Replicas
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(400)]
STREAM_ID = 6401


def _stage(o: ArchiveSinkOptions, batch: int, rows: list[bytes]) -> archive_sink.ArchiveStaged:
    return archive_sink.stage(o, "id", batch, iter([pa.record_batch({"value": rows})]))


def _read(archive: aeron_peer.JavaArchive) -> list[bytes]:
    src = parse_archive_source_options({"archive": archive.control_channel, "streamId": STREAM_ID})
    reader = AeronBatchReader(src, None)
    out: list[bytes] = []
    for part in reader.partitions():
        for batch in reader.read(part):
            out.extend(batch.column("value").to_pylist())
    return out


class _KilledAfterConnect(Replicas):
    """The replicas of one commit, with ``victim`` killed (-9) once they answered."""

    victim: aeron_peer.JavaArchive

    def connect(self) -> int:
        reachable = super().connect()
        self.victim.kill()
        return reachable


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
            stats = archive_sink.commit_batch(o, "id", n, [_stage(o, n, rows[n])])
            assert (stats.appended_rows, stats.replicas_in_sync) == (300, 1)  # acknowledged
        assert _read(a) == rows[0] + rows[1] == _read(b)
        # batch 1 committed again; its only replica dies once it answered
        parts = [dataclasses.replace(_stage(o, 1, rows[1]), attempt=1)]
        with archive_sink.connect(o.connect) as client:
            committer = archive_sink.ArchiveCommitter(o, "id", client)
            replicas = _KilledAfterConnect(o, "id")
            replicas.victim = b
            try:
                with replicas, pytest.raises(NotEnoughReplicasError) as failed:
                    committer.commit(1, parts, replicas=replicas)
            finally:
                committer.close()
        assert "undone" not in str(failed.value)
        assert _read(a) == rows[0] + rows[1]  # the acknowledged batch is still there
        # with the replica gone for good, the same batch with minInSyncReplicas=1: nothing
        # appended, every row once
        o1 = dataclasses.replace(o, min_insync_replicas=1)
        stats = archive_sink.commit_batch(o1, "id", 1, [_stage(o1, 1, rows[1])])
        assert (stats.skipped_duplicate, stats.appended_rows) == (1, 0)
        assert _read(a) == rows[0] + rows[1]

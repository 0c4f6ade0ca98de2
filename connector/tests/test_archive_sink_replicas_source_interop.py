"""The two halves of issue 30 together against real Java archives: what the archive sink writes
with ``replicas`` is what the source over ``archive="<primary>,<replica>"`` reads, as one
recording, and it goes on reading after the primary's kill -9.

Two ``ArchivingMediaDriver``s (``aeron_peer.java_archives``: free loopback ports, sleeping idle
strategies, stopped and removed after). The sink (``minInSyncReplicas=2``) appends each batch to
the primary's target and has the replica copy it (Aeron Archive's own replication). A streaming
source (``AeronStreamReader``, without Spark: offsets, partitions pickled as Spark ships them,
tasks read them) over both archives must see the target and its copy as one recording under one
offset key that stays the same from commit to commit (each append extends the target with a new
session id, which the archive's catalog keeps, so the session id cannot be part of the key), and
after the primary's kill -9 (the sink then promotes the replica) read the next batch from the
replica: every row exactly once. Skips without Java only; fails instead with
``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.errors import ReplicasUnavailableError
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_source_options,
)
from aeron_spark.connector.source import AeronStreamReader, decode_offset
from aeron_spark.connector.stores.archive import health

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import commit, replicated_sink  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(400)]

STREAM = 6401


@pytest.fixture
def archives(tmp_path: Path) -> Iterator[list[aeron_peer.JavaArchive]]:
    aeron_peer.require_java()
    with aeron_peer.java_archives(tmp_path, ["both-primary", "both-replica"], 0x6A1) as started:
        yield started


def _sink(primary: aeron_peer.JavaArchive, replica: aeron_peer.JavaArchive) -> ArchiveSinkOptions:
    return replicated_sink(primary, replica, STREAM, "both-halves")


class Stream:
    """A streaming query's source side, step by step as Spark's driver and tasks run it."""

    def __init__(self, channels: list[str], timeout_ms: int = 15000) -> None:
        self.reader = AeronStreamReader(
            parse_archive_source_options(
                {
                    "archive": ",".join(channels),
                    "streamId": str(STREAM),
                    "timeoutMs": str(timeout_ms),
                }
            )
        )
        self.offset = self.reader.initialOffset()

    def next_batch(self) -> list[bytes]:
        end = self.reader.latestOffset(self.offset, None)
        rows: list[bytes] = []
        for part in self.reader.partitions(self.offset, end):
            for batch in self.reader.read(pickle.loads(pickle.dumps(part))):
                rows += batch.column("value").to_pylist()
        self.reader.commit(end)
        self.offset = end
        return rows

    @property
    def keys(self) -> list[str]:
        return sorted(decode_offset(self.offset))


def test_the_source_over_the_sinks_replicas_reads_its_target_once_and_fails_over(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    primary, replica = archives
    o = _sink(primary, replica)
    rows = [[b"both-%d-%04d" % (n, i) for i in range(200)] for n in range(4)]
    for n in (0, 1):
        assert commit(o, n, rows[n], identity="q").replicas_in_sync == 1
    stream = Stream([primary.control_channel, replica.control_channel])
    # The target and its copy: one recording, every row once (not once per archive).
    assert stream.next_batch() == rows[0] + rows[1]
    (key,) = stream.keys
    # Another commit extends the target with a new session id: the same recording, same key.
    assert commit(o, 2, rows[2], identity="q").replicas_in_sync == 1
    assert stream.next_batch() == rows[2]
    assert stream.keys == [key]
    # kill -9 of the primary: the sink (now content with the replica alone) promotes it, and
    # the source reads from it.
    primary.kill()
    stats = commit(dataclasses.replace(o, min_insync_replicas=1), 3, rows[3], identity="q")
    assert (stats.appended_rows, stats.replicas_in_sync, stats.replicas_failed) == (200, 0, 1)
    assert stream.next_batch() == rows[3]
    assert stream.keys == [key]


def test_a_planned_batch_fewer_archives_confirm_later_is_waited_for_within_timeout_ms(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    """``minInSyncReplicas=2``: ``latestOffset`` plans two batches both archives hold; the
    replica is then killed (-9), so the primary alone cannot confirm them when the batch's
    partitions are made. Restarted meanwhile, the replica answers again: the partitions wait
    for it (``timeoutMs``, the source's bound on every wait) and the batch is read, every row
    once, instead of stopping the query with ``ReplicasUnavailableError`` as main did at once.
    A reader whose ``timeoutMs`` passes first still fails with it (nothing read)."""
    primary, replica = archives
    o = _sink(primary, replica)
    rows = [[b"wait-%d-%04d" % (n, i) for i in range(200)] for n in range(2)]
    for n in (0, 1):
        assert commit(o, n, rows[n], identity="q").replicas_in_sync == 1
    channels = [primary.control_channel, replica.control_channel]
    patient, hasty = Stream(channels, timeout_ms=240_000), Stream(channels, timeout_ms=1000)
    planned = [s.reader.latestOffset(s.offset, None) for s in (patient, hasty)]
    replica.kill()
    with pytest.raises(ReplicasUnavailableError):
        hasty.reader.partitions(hasty.offset, planned[1])
    restarted: list[aeron_peer.JavaArchive] = []
    back = threading.Thread(
        target=lambda: restarted.append(replica.restart_after_kill("both-replica2")),
        daemon=True,
    )
    back.start()
    try:
        parts = patient.reader.partitions(patient.offset, planned[0])
        read: list[bytes] = []
        for part in parts:
            for batch in patient.reader.read(pickle.loads(pickle.dumps(part))):
                read += batch.column("value").to_pylist()
        assert read == rows[0] + rows[1]
    finally:
        back.join(240)
        for archive in restarted:
            archive.close()


def test_an_archive_back_within_seconds_confirms_a_planned_batch_before_a_short_timeout_ms(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    """The replica, killed (-9) after ``latestOffset`` planned a batch both archives hold
    (``minInSyncReplicas=2``), is marked failed by a reader that found it dead (health's
    ``SKIP_S``, 30 s) and restarted seconds later. A reader with ``timeoutMs`` 8000 must ask it
    again and read the batch: the skip orders who serves reads, it does not ban the one archive
    a confirmation needs. Main never asked it while the primary answered, and failed after 8 s."""
    primary, replica = archives
    o = _sink(primary, replica)
    rows = [[b"back-%d-%04d" % (n, i) for i in range(200)] for n in range(2)]
    for n in (0, 1):
        assert commit(o, n, rows[n], identity="q").replicas_in_sync == 1
    channels = [primary.control_channel, replica.control_channel]
    reader, hasty = Stream(channels, timeout_ms=8000), Stream(channels, timeout_ms=1000)
    planned = [s.reader.latestOffset(s.offset, None) for s in (reader, hasty)]
    replica.kill()
    with pytest.raises(ReplicasUnavailableError):
        hasty.reader.partitions(hasty.offset, planned[1])  # finds it dead: marked failed
    back = replica.restart_after_kill("both-replica2")
    try:
        # back while its mark lasts (what this test is about; a restart slower than 30 s
        # would not test it)
        assert health.is_failed(replica.control_channel)
        read: list[bytes] = []
        for part in reader.reader.partitions(reader.offset, planned[0]):
            for batch in reader.reader.read(pickle.loads(pickle.dumps(part))):
                read += batch.column("value").to_pylist()
        assert read == rows[0] + rows[1]
        assert health.rechecks() >= 1  # asked again while marked, and counted
    finally:
        back.close()

"""The archive sink's ``replicas`` and ``minInSyncReplicas`` against real Java archives (issue 30).

Real ``ArchivingMediaDriver``s from the pinned aeron-all jar (``aeron_peer.java_archives``, the
replication tests' setup: free loopback ports, sleeping idle strategies, stopped and removed
after): the sink appends to the primary and each commit asks the replicas to replicate its target
recording (Aeron Archive's own replication). With ``minInSyncReplicas=2`` every row is read once
and the replica holds the same rows at the same positions; with ``minInSyncReplicas=3`` and a
replica killed (-9) the commit fails with NOT_ENOUGH_REPLICAS, before its append (the replica
does not answer) or after it (killed between the check and the replication: the append is cut
off again), and a committed-only reader sees nothing of the batch; the batch then goes in once.
Skips without Java only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.errors import ErrorCode, NotEnoughReplicasError
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_sink_options,
)
from aeron_spark.connector.stores.archive import health
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.connector.stores.archive.replicas import Replicas
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import (  # noqa: E402
    KilledAfterConnect,
    answers,
    commit,
    commit_fails,
    messages_on,
    read_rows,
    stage,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[aeron_peer.JavaArchive]]:
    names = ["sink-primary", "sink-replica-b"]
    with aeron_peer.module_archives(tmp_path_factory, "sink-replicas", names, 0x5A1) as started:
        yield started


def _options(
    primary: aeron_peer.JavaArchive,
    stream_id: int,
    replicas: list[aeron_peer.JavaArchive | str],
    min_insync: int,
    channel: str,
    **extra: str,
) -> ArchiveSinkOptions:
    return parse_archive_sink_options(
        {
            **extra,
            "archive": primary.control_channel,
            "channel": channel,
            "streamId": str(stream_id),
            "sinkId": f"replicated-{stream_id}",
            "timeoutMs": "15000",
            "replicas": ",".join(r if isinstance(r, str) else r.control_channel for r in replicas),
            "minInSyncReplicas": str(min_insync),
        }
    )


_Archive = aeron_peer.JavaArchive


@contextlib.contextmanager
def _three_archives(
    tmp_path: Path, prefix: str, first_id: int, stream_id: int, **extra: str
) -> Iterator[tuple[_Archive, _Archive, _Archive, ArchiveSinkOptions]]:
    """Archives ``<prefix>-a`` (the primary), ``-b`` and ``-c`` (its replicas) and a sink's
    options on them, ``minInSyncReplicas=2``. A promoted archive takes the sink's channels on
    its own host, same ports: here the same host, so staging gets a port of its own (a
    restarted primary stages there while the promoted one appends)."""
    aeron_peer.require_java()
    names = [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
    with aeron_peer.java_archives(tmp_path, names, first_id) as (a, b, c):
        o = _options(
            a,
            stream_id,
            [b, c],
            2,
            f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            archiveStagingChannel=f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            **extra,
        )
        yield a, b, c, o


def test_min_insync_replicas_2_every_row_once_and_the_replica_holds_the_same(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    primary, b = archives
    o = _options(primary, 6101, [b], 2, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")
    rows = [[b"b%d-row-%04d" % (n, i) + bytes(i % 300) for i in range(600)] for n in range(3)]
    for n in range(3):
        stats = commit(o, n, rows[n])
        assert (stats.appended_rows, stats.replicas_in_sync, stats.replicas_failed) == (600, 1, 0)
    again = commit(o, 2, rows[2][:10])  # a commit repeated (a restart): nothing appended
    assert (again.skipped_duplicate, again.appended_rows, again.replicas_in_sync) == (1, 0, 1)
    expected = [r for batch in rows for r in batch]
    assert read_rows(primary, 6101) == expected  # every row once, in batch and partition order
    stop, held = messages_on(o, primary)
    assert messages_on(o, b) == (stop, held)  # the same rows (and markers) at the same positions
    assert [m for _, m in held if not m.startswith(b"AERON-SPARK-SINK")] == expected


def test_min_insync_replicas_3_with_a_replica_down_commits_nothing(
    archives: list[aeron_peer.JavaArchive], tmp_path: Path
) -> None:
    primary, b = archives
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with aeron_peer.java_archives(tmp_path, ["sink-replica-c"], 0x5A3) as (c,):
        o = _options(primary, 6102, [b, c], 3, channel)
        first = [b"first-%03d" % i for i in range(200)]
        stats = commit(o, 0, first)
        assert (stats.appended_rows, stats.replicas_in_sync) == (200, 2)
        committed, _ = messages_on(o, b)
        # c dies after answering: the append goes in, too few copies reach its END: undone.
        rows = [b"second-%03d" % i for i in range(300)]
        replicas = KilledAfterConnect(o, "id")
        replicas.victim = c
        after = commit_fails(o, 1, [stage(o, 1, 0, rows)], replicas)
    assert after.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
    assert (after.value.required, after.value.in_sync) == (3, 2)
    assert list(after.value.failed) == [c.control_channel]
    assert "was undone" in str(after.value)
    assert read_rows(primary, 6102) == first  # nothing of batch 1 for a committed-only reader
    assert messages_on(o, primary)[0] == committed == messages_on(o, b)[0]  # cut back on both
    # c still down: refused before anything is appended.
    with pytest.raises(NotEnoughReplicasError, match="NOT_ENOUGH|minInSyncReplicas=3") as before:
        commit(o, 1, rows)
    assert "unreachable" in before.value.failed[c.control_channel]
    assert before.value.in_sync == 2 and "undone" not in str(before.value)
    assert read_rows(primary, 6102) == first
    # With minInSyncReplicas=2 (c still down) the batch goes in, once.
    o2 = dataclasses.replace(o, min_insync_replicas=2)
    stats = commit(o2, 1, rows)
    assert (stats.appended_rows, stats.replicas_in_sync, stats.replicas_failed) == (300, 1, 1)
    assert read_rows(primary, 6102) == first + rows
    assert messages_on(o, b) == messages_on(o, primary)


def test_replica_options_are_checked(archives: list[aeron_peer.JavaArchive]) -> None:
    primary, b = archives
    channel = "aeron:udp?endpoint=127.0.0.1:40999"
    assert _options(primary, 1, [], 1, channel).replicas == ()
    o = _options(primary, 1, [b], 2, channel)
    assert [r.control_channel for r in o.replicas] == [b.control_channel]
    assert o.replicas[0].timeout_s == o.connect.timeout_s
    for replicas, min_insync, match in (
        ([b], 3, "minInSyncReplicas.*from 1 to 2"),
        ([], 2, "minInSyncReplicas.*from 1 to 1"),
        ([b], 0, "minInSyncReplicas"),
        ([b, b], 1, "replicas.*each replica once"),
        ([primary], 1, "replicas.*not the archive itself"),
        (["udp://nowhere"], 1, "replicas.*control request channels"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            _options(primary, 1, replicas, min_insync, channel)


def test_primary_killed_a_replica_is_promoted_and_the_old_primary_reseeded(
    tmp_path: Path,
) -> None:
    """kill -9 of the primary between commits (``minInSyncReplicas=2``, two replicas): the next
    batch stages on the first replica that answers and the commit promotes the replica holding
    the last committed END (the first, on a tie), extends its copy and replicates it to the
    other; no acknowledged batch lost, none duplicated. The old primary restarted (same archive
    directory) is behind: the next commit stays on the promoted replica, stages on the old
    primary and brings its copy up to date; every archive then holds the same messages at the
    same positions and reads every row once."""
    with _three_archives(tmp_path, "promote", 0x5C1, 6201) as (a, b, c, o):
        rows = [[b"p%d-%04d" % (n, i) for i in range(300)] for n in range(4)]
        for n in (0, 1):
            assert commit(o, n, rows[n]).replicas_in_sync == 2
        a.kill()  # kill -9: the archive gone without a goodbye
        staged = stage(o, 2, 0, rows[2])
        assert staged.archive == b.control_channel  # the task staged beside the dead primary
        stats = archive_sink.commit_batch(o, "id", 2, [staged])
        assert (stats.appended_rows, stats.replicas_in_sync, stats.replicas_failed) == (300, 1, 1)
        assert read_rows(b, 6201) == rows[0] + rows[1] + rows[2]
        on_b = dataclasses.replace(o, connect=o.replicas[0])
        assert messages_on(on_b, c) == messages_on(on_b, b)
        # The old primary comes back (same directory, port and address): behind, so a replica
        # now (its killed JVM's stale mark file removed, as after a reboot).
        restarted = a.restart_after_kill("promote-a2")
        try:
            with archive_sink.connect(dataclasses.replace(o.connect, timeout_s=120)):
                pass  # its JVM answers (started again on a loaded machine)
            staged = stage(o, 3, 0, rows[3])
            assert staged.archive == ""  # staged on the configured primary again
            stats = archive_sink.commit_batch(o, "id", 3, [staged])
            assert (stats.appended_rows, stats.replicas_in_sync) == (300, 2)
            expected = [r for batch in rows for r in batch]
            for archive in (a, b, c):
                assert read_rows(archive, 6201) == expected, archive.control_channel
            held = messages_on(on_b, b)
            assert messages_on(on_b, a) == held == messages_on(on_b, c)
        finally:
            restarted.close()


def _cut_primary(o: ArchiveSinkOptions, position: int) -> None:
    """The primary's target cut back to ``position`` and nothing else: what a commit that
    failed with NOT_ENOUGH_REPLICAS leaves when it could undo its append on the primary but
    not on a replica that got it (the replica did not answer at that instant)."""
    with archive_sink.connect(o.connect) as client:
        target = archive_sink.ArchiveCommitter(o, "id", client).target()
        assert target is not None
        client.truncate_recording(target.recording_id, position)


def test_a_copy_of_a_batch_retried_in_another_order_is_repaired(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    """A replica keeps a batch the primary undid (its undo failed), and does not answer while
    Spark runs the batch again, whose rows come in another order (same rows, same sizes: every
    marker the same, and the same END position; ``minInSyncReplicas`` met by other replicas,
    here a commit without this one). Whether the replica's copy is then found at the primary's
    END of that batch (a commit repeated after a restart) or where a later batch starts, it
    must be found to differ from the primary and repaired: every archive then reads the same
    rows in the same order, at the same positions."""
    primary, b = archives
    o = _options(primary, 6106, [b], 2, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")
    alone = dataclasses.replace(o, replicas=(), min_insync_replicas=1)  # the replica away
    rows = [[b"o%d-row-%04d" % (n, i) for i in range(400)] for n in range(3)]
    assert commit(o, 0, rows[0]).replicas_in_sync == 1
    first = commit(o, 1, rows[1])
    assert first.replicas_in_sync == 1
    # (1) the retry, other order, without the replica; then the commit repeated with it
    _cut_primary(o, first.begin_position)
    retry = commit(alone, 1, rows[1][::-1])
    assert (retry.end_position, retry.appended_rows) == (first.end_position, 400)
    repeated = commit(o, 1, rows[1][::-1])
    assert (repeated.skipped_duplicate, repeated.replicas_in_sync) == (1, 1)
    assert repeated.replicas_repaired == 1
    assert read_rows(b, 6106) == rows[0] + rows[1][::-1] == read_rows(primary, 6106)
    assert messages_on(o, b) == messages_on(o, primary)
    # (2) again, the retry in the first order; the next batch finds the copy where it starts.
    # The repeated commit opened an epoch on both (the primary's retry was not on the copy);
    # a retry elected without the copy (other archives meeting minInSyncReplicas) saw that
    # epoch on one of them and opened one above it.
    assert repeated.epochs_opened == 1
    _cut_primary(o, first.begin_position)
    parts = [stage(alone, 1, 0, rows[1])]
    with archive_sink.connect(o.connect) as client:
        committer = archive_sink.ArchiveCommitter(
            alone, "id", client, epoch=repeated.epoch + 1, owner=client.archive_id()
        )
        assert committer.commit(1, parts).end_position == first.end_position
    later = commit(o, 2, rows[2])
    assert (later.replicas_in_sync, later.replicas_repaired) == (1, 1)
    assert read_rows(b, 6106) == rows[0] + rows[1] + rows[2] == read_rows(primary, 6106)
    assert messages_on(o, b) == messages_on(o, primary)


def test_a_reader_of_the_set_sees_no_batch_before_min_insync_archives_hold_it(
    tmp_path: Path,
) -> None:
    """``minInSyncReplicas=2``: a reader of every archive of the sink reads between the
    primary's END of a batch and any copy of it; the primary is then killed (-9), the commit
    fails (nothing acknowledged), and Spark runs the batch again, its rows in another order
    (same size: the same positions), on the promoted replica. Had the reader read the batch from
    the primary, a re-read of its partition (a retried task) would now give other rows, and
    rows that were never committed. It reads only what two archives hold (the END marker says
    how many archives its commit needs): the rows before the batch."""
    with _three_archives(tmp_path, "seen", 0x5F1, 6301, timeoutMs="5000") as (a, b, c, o):
        rows = [[b"s%d-row-%04d" % (n, i) for i in range(300)] for n in range(2)]
        assert commit(o, 0, rows[0]).replicas_in_sync == 2
        seen: list[bytes] = []

        class _ReadThenKill(Replicas):
            def sync(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                seen.extend(read_rows([a, b, c], 6301))  # the batch's END on the primary only
                a.kill()
                return super().sync(*args, **kwargs)

        commit_fails(o, 1, [stage(o, 1, 0, rows[1])], _ReadThenKill(o, "id"))
        retried = commit(o, 1, rows[1][::-1])  # promoted: b
        assert (retried.appended_rows, retried.replicas_in_sync) == (300, 1)
        assert seen == rows[0], "the reader saw a batch no commit acknowledged"
        assert read_rows([a, b, c], 6301) == rows[0] + rows[1][::-1]


def test_an_old_primarys_unacknowledged_batch_is_never_read_nor_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``minInSyncReplicas=2``: the primary writes a batch's END and is killed (-9) before any
    copy; the commit fails (nothing acknowledged) and Spark runs the batch again, its rows in
    another order (same size: the same positions), on the promoted replica, which copies it to
    the third archive. The old primary then comes back before any commit repaired it: it holds
    the never-acknowledged batch, ending at the same position as the acknowledged one. A reader
    naming every archive (the old primary first: its preferred one) must read the acknowledged
    rows, which two archives hold with the same END digest, never the old primary's; a reader
    naming the old primary and one replica (they disagree, neither batch on two of them) reads
    only what both hold the same: the rows before the batch. The next commit must not elect the
    old primary (first in the configured order, at the same committed end): it would cut the
    acknowledged batch off the others; it keeps it and repairs the old primary."""
    with _three_archives(tmp_path, "old", 0x5F5, 6302, timeoutMs="5000") as (a, b, c, o):
        rows = [[b"u%d-row-%04d" % (n, i) for i in range(300)] for n in range(2)]
        assert commit(o, 0, rows[0]).replicas_in_sync == 2

        class _KillBeforeCopies(Replicas):
            def sync(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                a.kill()  # the batch's END on the primary only
                return super().sync(*args, **kwargs)

        commit_fails(o, 1, [stage(o, 1, 0, rows[1])], _KillBeforeCopies(o, "id"))
        retried = commit(o, 1, rows[1][::-1])  # promoted: b, copied to c
        assert (retried.appended_rows, retried.replicas_in_sync) == (300, 1)
        restarted = a.restart_after_kill("old-a2")
        try:
            answers(a, o)
            health.mark_ok(a.control_channel)  # a reader in a process that never saw it fail
            on_b = dataclasses.replace(o, connect=o.replicas[0])
            held_a, held_b = messages_on(on_b, a), messages_on(on_b, b)
            assert held_a != held_b  # other rows (b's batch after the epoch it opened)
            assert read_rows(a, 6302) == rows[0] + rows[1]  # one archive: cannot know
            assert "name every archive of the sink" in caplog.text  # and says so
            acknowledged = rows[0] + rows[1][::-1]
            assert read_rows([a, b, c], 6302) == acknowledged
            assert read_rows([a, b], 6302) == rows[0]
            later = [b"u2-row-%04d" % i for i in range(300)]
            assert commit(o, 2, later).replicas_in_sync >= 1
            for archive in (b, c, a):
                assert read_rows(archive, 6302) == acknowledged + later, archive.control_channel
        finally:
            restarted.close()


def test_an_old_primarys_batch_is_not_kept_when_one_holder_of_the_acknowledged_one_is_reachable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hole the markers could not close without an epoch (``minInSyncReplicas=2``): the
    primary writes a batch's END and is killed (-9) before any copy; Spark runs the batch again,
    its rows in another order (same size), on the promoted replica, which copies it to the third
    archive: acknowledged. The third archive is then killed and the old primary comes back: one
    archive holds the acknowledged batch, one the batch never acknowledged, no END above the
    batch before them held by two. A reader of the set reads only the rows before the batch
    (it cannot tell); the next commit must keep the acknowledged batch and repair the old
    primary, never elect it (first in the configured order) and copy its batch over the
    acknowledged one (main did: the acknowledged rows were replaced by the unacknowledged). The
    old primary's copy is cut back to the last END both hold (where the histories part), not
    purged and copied afresh."""
    aeron_peer.require_java()
    names = ["epoch-a", "epoch-b", "epoch-c"]
    with aeron_peer.java_archives(tmp_path, names, 0x5E1) as (a, b, c):
        o = _options(
            a,
            6303,
            [b, c],
            2,
            f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            archiveStagingChannel=f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            timeoutMs="5000",
        )
        rows = [[b"e%d-row-%04d" % (n, i) for i in range(300)] for n in range(3)]
        assert commit(o, 0, rows[0]).replicas_in_sync == 2

        class _KillBeforeCopies(Replicas):
            def sync(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                a.kill()  # the batch's END on the primary only
                return super().sync(*args, **kwargs)

        parts = [stage(o, 1, 0, rows[1])]
        with archive_sink.connect(o.connect) as client:
            committer = archive_sink.ArchiveCommitter(o, "id", client)
            try:
                with _KillBeforeCopies(o, "id") as replicas, pytest.raises(NotEnoughReplicasError):
                    committer.commit(1, parts, replicas=replicas)
            finally:
                committer.close()
        retried = commit(o, 1, rows[1][::-1])  # promoted: b, copied to c
        assert (retried.appended_rows, retried.replicas_in_sync) == (300, 1)
        acknowledged = rows[0] + rows[1][::-1]
        c.kill()
        restarted = a.restart_after_kill("epoch-a2")
        try:
            answers(a, o)
            health.mark_ok(a.control_channel)
            assert read_rows(a, 6303) == rows[0] + rows[1]  # the old primary's own batch
            assert read_rows([a, b], 6303) == rows[0]  # neither batch on two: not read
            caplog.clear()
            stats = commit(o, 2, rows[2])
            assert (stats.appended_rows, stats.replicas_in_sync) == (300, 1)
            assert stats.epochs_opened == 1 and stats.replicas_repaired == 1
            assert "cut back to" in caplog.text and "does not; purged" not in caplog.text
            for archive in (b, a):
                assert read_rows(archive, 6303) == acknowledged + rows[2], archive.control_channel
            assert read_rows([a, b], 6303) == acknowledged + rows[2]
            on_b = dataclasses.replace(o, connect=o.replicas[0])
            assert messages_on(on_b, a) == messages_on(on_b, b)
        finally:
            restarted.close()

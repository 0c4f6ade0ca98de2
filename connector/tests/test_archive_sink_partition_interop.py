"""The archive sink's primary cut off or killed mid-commit, with replicas (issue 30), against
three real Java archives: the primary inside a network namespace behind a veth pair
(:class:`~aeron_spark.transport.testing_netns.LossyLink`; nftables drops every packet for the
partition: alive but unreachable), the two replicas in this namespace on the link's address.

Each test commits two batches (on every archive), then loses the primary at a chosen instant of
the third batch's commit: in the middle of its append (the target left with a torn tail: BEGIN
and some rows, no END) or after the END, before the replicas copied it (the primary alone holds
an unacknowledged batch). That commit fails and acknowledges nothing; the batch staged again (on
a replica: the primary does not answer) commits on the promoted replica, and one more after it.
The primary then comes back (the partition heals, or the killed archive restarts on its
directory): the next commit truncates its tail back to the last END it shares with the promoted
replica and re-seeds it. Every acknowledged batch is then on every archive once, nothing
duplicated, and a batch read of each archive gives the same rows at the same positions.

Needs root, ``ip`` and ``nft`` (skips without them; CI runs as root) and Java (skips without it;
fails instead with ``AERON_INTEROP_REQUIRED``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.archive_markers import target_alias
from aeron_spark.connector.errors import NotEnoughReplicasError
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_sink_options,
)
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.connector.stores.archive.replicas import Replicas, sink_recording
from aeron_spark.transport.archive.client import ArchiveClientError, RecordingSignal
from aeron_spark.transport.testing_netns import LossyLink, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import (  # noqa: E402
    UNREACHABLE,
    answers,
    messages_on,
    read_rows,
    stage,
)

netns_reason = unavailable_reason()
pytestmark = [
    pytest.mark.interop,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(netns_reason is not None, reason=netns_reason or ""),
]

TIMEOUT_MS = 5_000  # each attempt to reach the lost primary costs this much
STREAM_ID = 6301
ROWS = 200  # per partition, two partitions a batch


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[LossyLink, dict[str, aeron_peer.JavaArchive]]]:
    """The primary ``a`` in a network namespace, the replicas ``b`` and ``c`` here."""
    aeron_peer.require_java()
    with LossyLink() as link:
        here = (link.a.address, ())
        there = (link.b.address, link.b.command([]))
        with aeron_peer.archive_set(
            tmp_path / "archives",
            [("a", 0x5D1), ("b", 0x5D2), ("c", 0x5D3)],
            hosts={"a": there, "b": here, "c": here},
        ) as started:
            yield link, started


def _options(link: LossyLink, archives: dict[str, aeron_peer.JavaArchive]) -> ArchiveSinkOptions:
    port = aeron_peer.free_udp_port(link.a.address)
    staging = aeron_peer.free_udp_port(link.a.address)
    return parse_archive_sink_options(
        {
            "archive": archives["a"].control_channel,
            "replicas": f"{archives['b'].control_channel},{archives['c'].control_channel}",
            "minInSyncReplicas": "2",
            # on the primary's host; a promoted replica takes the same ports on its own
            "channel": f"aeron:udp?endpoint={link.b.address}:{port}",
            "archiveStagingChannel": f"aeron:udp?endpoint={link.b.address}:{staging}",
            "streamId": str(STREAM_ID),
            "sinkId": "partitioned",
            "timeoutMs": str(TIMEOUT_MS),
        }
    )


def _rows(batch: int) -> list[list[bytes]]:
    """Two partitions of rows of varied lengths."""
    return [[b"b%d-p%d-%04d-" % (batch, p, i) + bytes(i % 97) for i in range(ROWS)] for p in (0, 1)]


def _stage(o: ArchiveSinkOptions, batch: int) -> list[archive_sink.ArchiveStaged]:
    return [stage(o, batch, p, rows) for p, rows in enumerate(_rows(batch))]


class _LoseAroundSync(Replicas):
    """The replicas of one commit, with the primary lost once its END is recorded and its
    target stopped: before any replica copies the batch, or once they all did (before the
    staging recordings are purged)."""

    before: Callable[[], None] = staticmethod(lambda: None)
    after: Callable[[], None] = staticmethod(lambda: None)

    def sync(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.before()
        try:
            return super().sync(*args, **kwargs)
        finally:
            self.after()


def _lose_mid_append(monkeypatch: pytest.MonkeyPatch, lose: Callable[[], None]) -> None:
    """The primary lost once the append wrote its BEGIN and the first partition's rows."""
    real = archive_sink.Append.write_part

    def write_part(self, part, *args, **kwargs):  # type: ignore[no-untyped-def]
        if part.partition == 1:
            archive_sink._wait_recorded(
                self.c.client, self.recording_id, self.position, "the first partition"
            )
            lose()
        return real(self, part, *args, **kwargs)

    monkeypatch.setattr(archive_sink.Append, "write_part", write_part)


@pytest.mark.parametrize(
    ("how", "when"),
    [("cut", "mid-append"), ("cut", "after-end"), ("kill", "after-end"), ("kill", "after-sync")],
)
def test_primary_lost_mid_commit_a_replica_is_promoted_and_the_old_primary_truncated(
    hosts: tuple[LossyLink, dict[str, aeron_peer.JavaArchive]],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    when: str,
) -> None:
    """``mid-append``: the commit fails (its second part cannot be replayed from the lost
    primary); ``after-end``: the commit fails with NOT_ENOUGH_REPLICAS (no replica got the
    batch, and the primary's copy of it cannot be cut off: the next election repairs it);
    ``after-sync``: the batch is on every archive, the commit completes (its staging recordings
    stay on the lost primary)."""
    link, archives = hosts
    a, b, c = archives["a"], archives["b"], archives["c"]
    o = _options(link, archives)
    expected: list[bytes] = []
    for n in (0, 1):
        stats = archive_sink.commit_batch(o, "id", n, _stage(o, n))
        assert (stats.appended_rows, stats.replicas_in_sync) == (2 * ROWS, 2)
        expected += [r for part in _rows(n) for r in part]

    def lose() -> None:
        if how == "cut":
            link.set_loss(100)  # every packet to and from the primary's host dropped
        else:
            a.kill()

    # batch 2: staged on the primary, which is lost during the commit
    parts = _stage(o, 2)
    assert {p.archive for p in parts} == {""}
    replicas = _LoseAroundSync(o, "id")
    if when == "mid-append":
        _lose_mid_append(monkeypatch, lose)
    elif when == "after-end":
        replicas.before = lose
    else:
        replicas.after = lose
    retried = [2, 3]
    with archive_sink.connect(o.connect) as client:
        committer = archive_sink.ArchiveCommitter(o, "id", client)
        try:
            with replicas:
                if when == "after-sync":
                    stats = committer.commit(2, parts, replicas=replicas)
                    assert (stats.appended_rows, stats.replicas_in_sync) == (2 * ROWS, 2)
                    expected += [r for part in _rows(2) for r in part]
                    retried = [3]
                else:
                    expect = NotEnoughReplicasError if when == "after-end" else UNREACHABLE
                    with pytest.raises(expect) as failed:
                        committer.commit(2, parts, replicas=replicas)
                    print(f"{how} {when}: {type(failed.value).__name__}: {failed.value}")
        finally:
            monkeypatch.undo()
            committer.close()
    # nothing acknowledged (but after-sync); the batch is staged again (beside the lost
    # primary) and committed on the promoted replica, then one more batch
    for n in retried:
        parts = _stage(o, n)
        assert {p.archive for p in parts} == {b.control_channel}
        stats = archive_sink.commit_batch(o, "id", n, parts)
        assert (stats.appended_rows, stats.replicas_in_sync, stats.replicas_failed) == (
            2 * ROWS,
            1,
            1,
        )
        expected += [r for part in _rows(n) for r in part]
    on_b = dataclasses.replace(o, connect=o.replicas[0])
    assert read_rows(b, STREAM_ID) == expected == read_rows(c, STREAM_ID)
    assert messages_on(on_b, c) == messages_on(on_b, b)
    # the old primary comes back, behind, holding what nobody acknowledged
    if how == "cut":
        link.set_loss(0)
    else:
        restarted = a.restart_after_kill("cut-a2")  # its stale mark file removed
        archives["a2"] = restarted  # stopped with the others
    answers(a, o)
    parts = _stage(o, 4)
    assert {p.archive for p in parts} == {""}  # staged on the configured primary again
    stats = archive_sink.commit_batch(o, "id", 4, parts)
    assert (stats.appended_rows, stats.replicas_in_sync, stats.replicas_repaired) == (
        2 * ROWS,
        2,
        1,
    )
    expected += [r for part in _rows(4) for r in part]
    for archive in (a, b, c):
        assert read_rows(archive, STREAM_ID) == expected, archive.control_channel  # every row once
    held = messages_on(on_b, b)
    assert (
        messages_on(on_b, a) == held == messages_on(on_b, c)
    )  # the same messages at the same positions


GIVE_UP_MS = 2_000  # the sink's timeoutMs (Java's replication waits 10 s for its source)


@pytest.fixture
def pair(
    tmp_path: Path,
) -> Iterator[tuple[LossyLink, aeron_peer.JavaArchive, aeron_peer.JavaArchive]]:
    """The primary ``a`` in a network namespace, its one replica ``b`` here."""
    aeron_peer.require_java()
    with LossyLink() as link:
        with aeron_peer.archive_set(
            tmp_path / "archives",
            [("a", 0x5E1), ("b", 0x5E2)],
            hosts={"a": (link.b.address, link.b.command([])), "b": (link.a.address, ())},
        ) as started:
            yield link, started["a"], started["b"]


def _copy_on(archive: aeron_peer.JavaArchive, o: ArchiveSinkOptions) -> tuple[int, bool]:
    """(stop position or recorded position, still recording) of the sink's copy on
    ``archive``."""
    connect = dataclasses.replace(o.connect, control_channel=archive.control_channel)
    with archive_sink.connect(connect) as client:
        d = sink_recording(client, target_alias(o.sink.sink_id), STREAM_ID)
        assert d is not None
        if d.is_active:
            return client.recording_position(d.recording_id), True
        return d.stop_position, False


def test_a_replica_given_up_on_copies_nothing_when_the_partition_heals(
    pair: tuple[LossyLink, aeron_peer.JavaArchive, aeron_peer.JavaArchive],
) -> None:
    """The primary is cut off from its replica once its END is recorded; the sink waits
    ``timeoutMs`` for the replica's copy and gives up. The partition heals at that moment,
    before the sink cuts the batch off the primary: a replication left running (the replica
    archive retries its connect to the primary for 10 s) now copies the batch, which is then
    never acknowledged (NOT_ENOUGH_REPLICAS), and which a committed-only reader of the replica
    would read (and an election would find furthest). The sink stops the replication when it
    gives up: the copy stays at the last acknowledged END."""
    link, a, b = pair
    port = aeron_peer.free_udp_port(link.a.address)
    staging = aeron_peer.free_udp_port(link.a.address)
    o = parse_archive_sink_options(
        {
            "archive": a.control_channel,
            "replicas": b.control_channel,
            "minInSyncReplicas": "2",
            "channel": f"aeron:udp?endpoint={link.b.address}:{port}",
            "archiveStagingChannel": f"aeron:udp?endpoint={link.b.address}:{staging}",
            "streamId": str(STREAM_ID),
            "sinkId": "given-up",
            "timeoutMs": str(GIVE_UP_MS),
        }
    )
    expected: list[bytes] = []
    for n in (0, 1):
        stats = archive_sink.commit_batch(o, "id", n, _stage(o, n))
        assert (stats.appended_rows, stats.replicas_in_sync) == (2 * ROWS, 1)
        expected += [r for part in _rows(n) for r in part]
    acknowledged = _copy_on(b, o)
    assert not acknowledged[1]
    parts = _stage(o, 2)
    replicas = _LoseAroundSync(o, "id")
    replicas.before = lambda: link.set_loss(100)

    def heal() -> None:
        """The partition healed; until the replica's replication of this commit is over (it
        ends by itself: copied, failed, or stopped), bounded."""
        link.set_loss(0)
        client = replicas.clients[0]
        assert client is not None
        for replication in list(client.session.replications):
            try:
                client.wait_for_replication(
                    replication, RecordingSignal.REPLICATE_END, timeout_s=30
                )
            except ArchiveClientError as exc:  # it failed: what it copied is checked below
                print(f"replication {replication}: {exc}")

    replicas.after = heal
    with archive_sink.connect(o.connect) as client:
        committer = archive_sink.ArchiveCommitter(o, "id", client)
        try:
            with replicas, pytest.raises(NotEnoughReplicasError) as failed:
                committer.commit(2, parts, replicas=replicas)
        finally:
            link.set_loss(0)
            committer.close()
    print(failed.value)
    assert "was undone" in str(failed.value)  # off the primary (reachable again)
    assert _copy_on(b, o) == acknowledged, "the replica copied an unacknowledged batch"
    assert read_rows(b, STREAM_ID) == expected == read_rows(a, STREAM_ID)
    assert replicas.stopped_replications == 1

"""What the archive sink's interop tests share (issue 30): staging a partition's rows, committing
a batch in two partitions (or with replicas that fail, the commit failing with
NOT_ENOUGH_REPLICAS), reading a stream back as a committed-only reader, the messages a
sink's recording holds at which positions, waiting for an archive to answer again, and a set of
replicas with one killed once they answered. Beside :mod:`aeron_peer` (every such test puts this
folder on ``sys.path``); real archives only, nothing here stands in for one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import aeron_peer
import pyarrow as pa
import pytest

from aeron_spark.connector.errors import ConnectorError, NotEnoughReplicasError
from aeron_spark.connector.formats import Geometry, iter_messages
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_sink_options,
    parse_archive_source_options,
)
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.source import AeronBatchReader
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.connector.stores.archive.replicas import Replicas, find_copy
from aeron_spark.transport import TransportError
from aeron_spark.transport.archive.client import ArchiveClientError

# what a connect to an archive that is down or cut off fails with
UNREACHABLE = (ConnectorError, ArchiveClientError, TransportError, OSError)


def replicated_sink(
    primary: aeron_peer.JavaArchive, replica: aeron_peer.JavaArchive, stream_id: int, sink_id: str
) -> ArchiveSinkOptions:
    """A sink's options on ``primary`` with ``replica``, both to hold a batch
    (``minInSyncReplicas`` 2), its channel and staging channel each on a free port of this host
    (a promoted replica takes the sink's channels on its own host, here the same one)."""
    return parse_archive_sink_options(
        {
            "archive": primary.control_channel,
            "channel": f"aeron:udp?endpoint=127.0.0.1:{aeron_peer.free_udp_port()}",
            "archiveStagingChannel": f"aeron:udp?endpoint=127.0.0.1:{aeron_peer.free_udp_port()}",
            "streamId": str(stream_id),
            "sinkId": sink_id,
            "timeoutMs": "15000",
            "replicas": replica.control_channel,
            "minInSyncReplicas": "2",
        }
    )


def channel_of(archive: aeron_peer.JavaArchive | str) -> str:
    return archive if isinstance(archive, str) else archive.control_channel


def stage(
    o: ArchiveSinkOptions, batch: int, partition: int, rows: list[bytes], identity: str = "id"
) -> archive_sink.ArchiveStaged:
    """One task's staging of ``rows`` as partition ``partition`` of ``batch``."""
    staged = archive_sink.stage(o, identity, batch, iter([pa.record_batch({"value": rows})]))
    return dataclasses.replace(staged, partition=partition)


def commit(
    o: ArchiveSinkOptions, batch: int, rows: list[bytes], identity: str = "id"
) -> archive_sink.CommitStats:
    """``rows`` staged in two partitions (the second half staged first) and committed."""
    half = len(rows) // 2
    parts = [
        stage(o, batch, 1, rows[half:], identity),
        stage(o, batch, 0, rows[:half], identity),
    ]
    return archive_sink.commit_batch(o, identity, batch, parts)


def commit_fails(
    o: ArchiveSinkOptions,
    batch: int,
    parts: list[archive_sink.ArchiveStaged],
    replicas: Replicas,
    identity: str = "id",
) -> pytest.ExceptionInfo[NotEnoughReplicasError]:
    """``parts`` committed as ``batch`` on ``o``'s primary with ``replicas`` (one that loses
    some of them mid-commit; closed after, the committer too): the commit must fail with
    NOT_ENOUGH_REPLICAS; what it raised."""
    with archive_sink.connect(o.connect) as client:
        committer = archive_sink.ArchiveCommitter(o, identity, client)
        try:
            with replicas, pytest.raises(NotEnoughReplicasError) as failed:
                committer.commit(batch, parts, replicas=replicas)
        finally:
            committer.close()
    return failed


def read_rows(
    archives: aeron_peer.JavaArchive | str | Sequence[aeron_peer.JavaArchive | str],
    stream_id: int,
) -> list[bytes]:
    """Every row a committed-only reader (the archive source) reads of the stream, on one
    archive or on a set of them (``archive`` naming each)."""
    if isinstance(archives, aeron_peer.JavaArchive | str):
        archives = [archives]
    channels = ",".join(channel_of(a) for a in archives)
    reader = AeronBatchReader(
        parse_archive_source_options({"archive": channels, "streamId": stream_id}), None
    )
    out: list[bytes] = []
    for part in reader.partitions():
        for batch in reader.read(part):
            out.extend(batch.column("value").to_pylist())
    return out


def messages_on(o: ArchiveSinkOptions, archive: aeron_peer.JavaArchive | str) -> tuple[int, list]:
    """(stop position, [(position, payload)] of every message, markers included) of the sink's
    recording on ``archive``: ``o``'s primary's target (found by the sink's alias), or its
    copy there."""
    with archive_sink.connect(o.connect) as primary:
        target = archive_sink.ArchiveCommitter(o, "id", primary, promoted=True).target()
        assert target is not None
        connect = dataclasses.replace(o.connect, control_channel=channel_of(archive))
        with archive_sink.connect(connect) as client:
            d = find_copy(client, target)
            assert d is not None and d.stop_position >= 0, channel_of(archive)
            blocks = [
                ReplayBlock(b.position, b.data, 0, b.end_position)
                for b in client.replay(d.recording_id, d.start_position, d.stop_position)
            ]
    geometry = Geometry(d.initial_term_id, d.term_buffer_length)
    return d.stop_position, [
        (m.position, bytes(m.payload)) for m in iter_messages(blocks, geometry)
    ]


def answers(
    archive: aeron_peer.JavaArchive | str, o: ArchiveSinkOptions, within_s: float = 180
) -> None:
    """Until ``archive`` answers again (a healed partition, a restarted JVM), bounded."""
    deadline = time.monotonic() + within_s
    connect = dataclasses.replace(o.connect, control_channel=channel_of(archive))
    while True:
        try:
            with archive_sink.connect(connect):
                return
        except UNREACHABLE:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class KilledAfterConnect(Replicas):
    """The replicas of one commit, with ``victim`` killed (-9) once they answered: the commit
    finds enough replicas before its append and too few after it."""

    victim: aeron_peer.JavaArchive

    def connect(self) -> int:
        reachable = super().connect()
        self.victim.kill()
        return reachable

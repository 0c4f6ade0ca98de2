"""Attacks on how a set of archive replicas bounds what a reader may read (issue 30): a sink's
target that fewer than ``minInSyncReplicas`` reachable archives can confirm, and the source's
cached message boundary of a recording whose bytes changed under it. Pure decisions, no archive
running (the real archives are in ``test_archive_replicas_interop.py``)."""

from __future__ import annotations

import dataclasses

from aeron_spark.connector.options import parse_archive_source_options
from aeron_spark.connector.source import _partitions
from aeron_spark.connector.stores import Recording
from aeron_spark.connector.stores.archive import ArchiveStore
from aeron_spark.connector.stores.replicas import ReplicaStore, in_sync_end

A = "aeron:udp?endpoint=127.0.0.1:8010"
B = "aeron:udp?endpoint=127.0.0.1:8011"


def _options(archive: str):  # type: ignore[no-untyped-def]
    return parse_archive_source_options({"archive": archive, "streamId": "7"})


def test_a_target_fewer_archives_can_confirm_is_not_read_as_truncated() -> None:
    """A sink's target committed with ``minInSyncReplicas=2`` read through ``[A, B]``; the
    reader is at 4096 when A dies. B alone cannot confirm any batch, so the set's end falls to
    the recording's start: nothing more may be read, but nothing was truncated either. On the
    old code the next batch planned (another recording moved on) failed with
    ``PurgedError: ... was truncated to 0, below the offset 4096`` (failOnDataLoss's default),
    killing the query the replicas were meant to keep running."""
    o = _options(f"{A},{B}").source
    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    copy_b = Recording("t", store, 2, 7, 0, 3, 65536, 1408, 0, 0, 4096)
    copy_b = dataclasses.replace(copy_b, committed_only=True, alias="s", insync=2)
    end = in_sync_end([copy_b], [False], archives=2)
    assert end == 0  # B alone confirms nothing
    # what ReplicaSession.recordings gives for it (its end held back, B the only copy)
    target = dataclasses.replace(copy_b, end=end, holders=(B,), held=4096)
    other = Recording("o", store, 5, 7, 9, 3, 65536, 1408, 0, 0, 1024)
    recordings = {"t": target, "o": other}
    parts = _partitions(o, recordings, {"t": 4096, "o": 0}, {"t": 4096, "o": 1024})
    assert [(p.key, p.start, p.end) for p in parts] == [("o", 0, 1024)]

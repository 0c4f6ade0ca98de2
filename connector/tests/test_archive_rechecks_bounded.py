"""Probes of an archive marked failed (``health.RECHECK_S``), counted and bounded.

* The source over a set of archives asks a marked archive again when only it can confirm a
  sink's batch (fewer archives hold it than its ``minInSyncReplicas``). While that archive is
  really down, every planning pass (0.5-1 s apart while a reader waits out ``timeoutMs``)
  probed it again. Now an archive is probed again at most once per ``recheckIntervalMs``
  (5 s by default) in a process.
* The archive sink's own probes of a marked archive (staging, the commit's election) were not
  counted; they are now, in the same ``health.rechecks()``.

Real Java archives (``aeron_peer.java_archives``); skips without Java only."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.errors import ReplicasUnavailableError
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_source_options,
)
from aeron_spark.connector.source import AeronStreamReader
from aeron_spark.connector.stores.archive import health

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import commit, replicated_sink  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(400)]

STREAM = 6403
TIMEOUT_MS = 9000  # the reader's bound: planning passes 0.5-1 s apart until it runs out


@pytest.fixture
def archives(tmp_path: Path) -> Iterator[list[aeron_peer.JavaArchive]]:
    aeron_peer.require_java()
    with aeron_peer.java_archives(tmp_path, ["probe-primary", "probe-replica"], 0x6A3) as started:
        yield started


def _sink(primary: aeron_peer.JavaArchive, replica: aeron_peer.JavaArchive) -> ArchiveSinkOptions:
    return replicated_sink(primary, replica, STREAM, "probes")


def _reader(channels: list[str], timeout_ms: int) -> AeronStreamReader:
    return AeronStreamReader(
        parse_archive_source_options(
            {"archive": ",".join(channels), "streamId": str(STREAM), "timeoutMs": str(timeout_ms)}
        )
    )


def test_a_dead_archive_is_probed_again_at_most_once_per_recheck_interval(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    primary, replica = archives
    o = _sink(primary, replica)
    rows = [[b"probe-%d-%04d" % (n, i) for i in range(50)] for n in range(2)]
    for n in (0, 1):
        assert commit(o, n, rows[n], identity="q").replicas_in_sync == 1
    channels = [primary.control_channel, replica.control_channel]
    reader = _reader(channels, TIMEOUT_MS)
    offset = reader.initialOffset()
    planned = reader.latestOffset(offset, None)
    replica.kill()  # for good: every pass finds the batch unconfirmed, only it could confirm
    before = health.rechecks()
    began = time.monotonic()
    with pytest.raises(ReplicasUnavailableError):
        reader.partitions(offset, planned)
    waited = time.monotonic() - began
    probes = health.rechecks() - before
    # one at the first pass that found it marked, then one per 5 s (the default interval);
    # main: one every pass
    assert probes <= waited / 5.0 + 1, (probes, waited)


def test_the_sinks_probes_of_a_marked_archive_are_counted(
    archives: list[aeron_peer.JavaArchive],
) -> None:
    primary, replica = archives
    o = _sink(primary, replica)
    replica.kill()
    one = dataclasses.replace(o, min_insync_replicas=1)
    rows = [b"sink-%04d" % i for i in range(50)]
    commit(one, 0, rows, identity="s")  # finds the replica dead: marked failed
    assert health.is_failed(replica.control_channel)
    before = health.rechecks()
    commit(one, 1, rows, identity="s")  # probes it again (RECHECK_S): counted
    assert health.rechecks() > before  # main: 0 (uncounted)


def test_the_recheck_interval_is_validated() -> None:
    archives = "aeron:udp?endpoint=127.0.0.1:8010,aeron:udp?endpoint=127.0.0.1:8020"
    base = {"archive": archives, "streamId": str(STREAM)}
    assert parse_archive_source_options(base).recheck_interval_s == 5.0
    given = parse_archive_source_options({**base, "recheckIntervalMs": "2000"})
    assert given.recheck_interval_s == 2.0
    for bad in ("0", "99", "30001", "soon"):
        with pytest.raises(Exception, match="recheckIntervalMs"):
            parse_archive_source_options({**base, "recheckIntervalMs": bad})

"""The archive source's cache of message boundaries is bounded, against a real Java archive.

A reader of a set of archives finds, for every recording it lists, the last message boundary at
or below the end the set agrees on (``message_end``), and keeps it per (control channel,
recording id) so that listing an active recording again reads only what was recorded since.
The cache grew by one entry per recording for the life of the process: a long-running reader
over many recordings (one per publisher session, a new one after every restart of each) held
every one of them. It now keeps the ``_BOUNDARIES_MAX`` most recently used; one evicted is
walked again from its last term's start and still gives the right end. Skips without Java
only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.options import parse_archive_source_options
from aeron_spark.connector.source import AeronStreamReader, decode_offset
from aeron_spark.connector.stores.archive import source as archive_source
from aeron_spark.transport.archive.client import ArchiveClient, RecordingSignal
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]

TERM = 64 * 1024
WAIT_S = 60.0  # bounded waits, sized for a loaded 2-core machine
CAP = 4  # the cache's bound for this test (the module's default is 4096)
SESSIONS = 7  # recordings of the stream: more than CAP


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aeron_peer.JavaArchive]:
    aeron_peer.require_java()
    root = tmp_path_factory.mktemp("boundaries")
    with aeron_peer.java_archives(root, ["bounds"], 0x7B1) as (started,):
        yield started


def _recorded(client: ArchiveClient, recording_id: int, position: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while client.recording_position(recording_id) < position:
        assert time.monotonic() < deadline, f"not recorded up to {position}"
        time.sleep(0.02)


def _latest(archive: aeron_peer.JavaArchive, stream_id: int) -> dict[str, int]:
    """Every recording's end offered by a reader of a set of two archives, the second down
    (nothing listens on its port): the set's path, where each end is a message boundary."""
    channel = f"{archive.control_channel},aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    options = parse_archive_source_options(
        {"archive": channel, "streamId": str(stream_id), "timeoutMs": "10000"}
    )
    reader = AeronStreamReader(options, None)
    return decode_offset(reader.latestOffset(reader.initialOffset(), None))


def test_the_message_boundary_cache_keeps_at_most_its_bound_of_recordings(
    archive: aeron_peer.JavaArchive, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive_source, "_BOUNDARIES", OrderedDict())
    # raising=False: the old code had no bound to set (and kept every recording)
    monkeypatch.setattr(archive_source, "_BOUNDARIES_MAX", CAP, raising=False)
    stream_id = 7301
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    ends: list[int] = []
    recording_ids: list[int] = []
    with ArchiveClient.connect(archive.control_channel) as client:
        sub_id = client.start_recording(channel, stream_id)
        try:
            for i in range(SESSIONS):  # one recording per publisher session
                pub = client.driver.add_publication(
                    f"{channel}|term-length={TERM}|session-id={9100 + i}", stream_id
                )
                try:
                    assert pub.wait_until_connected(WAIT_S)
                    rid = client.wait_for_signal(
                        lambda e: (
                            e.subscription_id == sub_id
                            and e.signal == RecordingSignal.START
                            and e.recording_id not in recording_ids
                        ),
                        WAIT_S,
                    ).recording_id
                    for k in range(i + 1):
                        end = pub.offer_blocking(b"row-%d-%d" % (i, k), timeout_s=WAIT_S)
                    _recorded(client, rid, end)
                finally:
                    pub.close()
                recording_ids.append(rid)
                ends.append(end)
        finally:
            client.stop_recording_subscription(sub_id)
    offered = _latest(archive, stream_id)
    assert sorted(offered.values()) == sorted(ends)  # every recording's end, each a boundary
    cache = archive_source._BOUNDARIES
    assert len(cache) <= CAP, f"{len(cache)} recordings cached, the bound is {CAP}"
    kept = {rid for _channel, rid in cache}
    assert kept <= set(recording_ids)
    # evicted ones are walked again, their ends the same; the cache stays within its bound
    assert _latest(archive, stream_id) == offered
    assert len(archive_source._BOUNDARIES) <= CAP

"""The archive source never offers an end, nor delivers rows, inside a fragmented message
(issue 30, the archive side of the stream server's ingest fix), against a real Java archive.

An Aeron Archive records frames as they arrive: a publisher in the middle of a large message
(its BEGIN fragment recorded, its END not yet), or a recording stopped there, leaves the
recorded position inside the message; an image that joins late (or a copy made from such a
recording) begins inside one. Our own publication (``offer_block``: frames as we frame them)
puts exactly those cases into a real ``ArchivingMediaDriver``: ``latestOffset`` must end at
the last whole message, a batch read must return whole messages only, and a recording that
begins inside a message must be read from its first whole one. Skips without Java only;
fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.options import parse_archive_source_options
from aeron_spark.connector.source import AeronBatchReader, AeronStreamReader, decode_offset
from aeron_spark.transport.archive.client import ArchiveClient, RecordingSignal
from aeron_spark.transport.driver.client import Publication
from aeron_spark.transport.protocol.frames import DataFlags, DataFrame
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]

TERM = 64 * 1024
WAIT_S = 60.0  # bounded waits, sized for a loaded 2-core machine


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aeron_peer.JavaArchive]:
    with aeron_peer.module_archives(tmp_path_factory, "partial", ["partial"], 0x7A1) as (started,):
        yield started


def _block(*fragments: tuple[bytes, int]) -> bytes:
    """Frames of the given payloads and flags (``offer_block`` writes the offsets and ids)."""
    return b"".join(DataFrame(0, 0, 0, 0, payload, flags).encode() for payload, flags in fragments)


BIG = [bytes([65 + i]) * 1000 for i in range(3)]  # one message of three fragments
BEGIN = (BIG[0], DataFlags.BEGIN)
MIDDLE = (BIG[1], 0)
END = (BIG[2], DataFlags.END)


def _recorded(client: ArchiveClient, recording_id: int, position: int) -> None:
    """Until the archive has recorded up to ``position`` (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while client.recording_position(recording_id) < position:
        assert time.monotonic() < deadline, f"not recorded up to {position}"
        time.sleep(0.02)


@contextlib.contextmanager
def _recorded_publication(
    client: ArchiveClient, channel: str, stream_id: int, params: str, stop_recording: bool
) -> Iterator[tuple[Publication, int, int]]:
    """A recording of ``stream_id`` on ``channel`` and our publication to it (``channel`` with
    ``params``), connected and its recording started: (publication, recording subscription id,
    recording id). The publication closed after; then (``stop_recording``) the recording
    stopped."""
    sub_id = client.start_recording(channel, stream_id)
    pub = client.driver.add_publication(f"{channel}|{params}", stream_id)
    try:
        assert pub.wait_until_connected(WAIT_S)
        recording_id = client.wait_for_signal(
            lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START,
            WAIT_S,
        ).recording_id
        yield pub, sub_id, recording_id
    finally:
        pub.close()
        if stop_recording:
            client.stop_recording_subscription(sub_id)


def _options(archive: aeron_peer.JavaArchive, stream_id: int, set_of: bool) -> dict[str, str]:
    """One archive; or (``set_of``) a set of replicas, the second one down (nothing listens
    on its port: refused at once), so that the set's own path (one end for all copies) runs."""
    channel = archive.control_channel
    if set_of:
        channel += f",aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    return {"archive": channel, "streamId": str(stream_id), "timeoutMs": "10000"}


def _read(archive: aeron_peer.JavaArchive, stream_id: int, set_of: bool = False) -> list[bytes]:
    options = parse_archive_source_options(_options(archive, stream_id, set_of))
    reader = AeronBatchReader(options, None)
    out: list[bytes] = []
    for part in reader.partitions():
        for batch in reader.read(part):
            out.extend(batch.column("value").to_pylist())
    return out


def _latest(archive: aeron_peer.JavaArchive, stream_id: int, set_of: bool = False) -> int:
    options = parse_archive_source_options(_options(archive, stream_id, set_of))
    reader = AeronStreamReader(options, None)
    (position,) = decode_offset(reader.latestOffset(reader.initialOffset(), None)).values()
    return position


def test_the_recorded_end_inside_a_message_is_never_offered_nor_read(
    archive: aeron_peer.JavaArchive,
) -> None:
    stream_id = 7101
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with (
        ArchiveClient.connect(archive.control_channel) as client,
        _recorded_publication(
            client, channel, stream_id, f"term-length={TERM}", stop_recording=False
        ) as (pub, sub_id, recording_id),
    ):
        whole = [b"whole-%d" % i for i in range(3)]
        for payload in whole:
            boundary = pub.offer_blocking(payload, timeout_s=WAIT_S)
        # the publisher is in the middle of a message: its first two fragments recorded
        inside = pub.offer_block_blocking(_block(BEGIN, MIDDLE), timeout_s=WAIT_S)
        _recorded(client, recording_id, inside)
        for set_of in (False, True):
            assert _latest(archive, stream_id, set_of) == boundary  # not the recorded end
            assert _read(archive, stream_id, set_of) == whole
        # the message completes, another follows: both read
        done = pub.offer_block_blocking(_block(END), timeout_s=WAIT_S)
        after = pub.offer_blocking(b"after", timeout_s=WAIT_S)
        _recorded(client, recording_id, after)
        assert _latest(archive, stream_id) == after
        assert _read(archive, stream_id) == [*whole, b"".join(BIG), b"after"]
        assert done < after
        # the recording stopped inside the next message
        cut = pub.offer_block_blocking(_block(BEGIN), timeout_s=WAIT_S)
        _recorded(client, recording_id, cut)
        client.stop_recording_subscription(sub_id)
        deadline = time.monotonic() + WAIT_S
        while client.stop_position(recording_id) < 0:
            assert time.monotonic() < deadline, "the recording did not stop"
            time.sleep(0.02)
        assert client.stop_position(recording_id) == cut
    assert _latest(archive, stream_id) == after
    assert _read(archive, stream_id) == [*whole, b"".join(BIG), b"after"]


def test_a_recording_that_begins_inside_a_message_is_read_from_the_first_whole_one(
    archive: aeron_peer.JavaArchive,
) -> None:
    """A late join: the recording's first frames are the middle and END fragments of a message
    whose BEGIN it never saw (our publication starts at a term offset, as an image joining a
    stream there does)."""
    stream_id = 7102
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    joined = 4096
    params = f"term-length={TERM}|init-term-id=7|term-id=7|term-offset={joined}"
    with (
        ArchiveClient.connect(archive.control_channel) as client,
        _recorded_publication(client, channel, stream_id, params, stop_recording=True) as (
            pub,
            _,
            recording_id,
        ),
    ):
        pub.offer_block_blocking(_block(MIDDLE, END), timeout_s=WAIT_S)
        rows = [b"late-%d" % i for i in range(3)]
        for payload in rows:
            last = pub.offer_blocking(payload, timeout_s=WAIT_S)
        _recorded(client, recording_id, last)
        d = client.list_recording(recording_id)
        assert d is not None and d.start_position == joined
        for set_of in (False, True):
            assert _read(archive, stream_id, set_of) == rows
            assert _latest(archive, stream_id, set_of) == last

"""The source over a set of archive replicas against three real Java archives (issue 30).

``aeron_peer.archive_set`` runs three ``ArchivingMediaDriver``s at once (sleeping idle
strategies, free ports, stopped by the fixture): ``primary`` records our multi-destination
publication; ``second`` and ``third`` replicate that recording with a live merge (Aeron's own
``replicate``, asked by our client), so they follow it as it grows. ``AeronBatchReader`` reads
through ``archive="<primary>,<second>,<third>"`` (partitions pickled as Spark ships them): the
same rows as the primary alone, one partition per recording and its copies; a task whose archive
is killed (kill -9) mid-range goes on from the next replica at the position it had reached,
every row once; with no archive able to serve, the coded ``ReplicasUnavailableError`` names them
all. The kill is the module's last test. Skips without Java only; fails instead with
``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import logging
import pickle
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aeron_spark.connector.errors import ErrorCode, ReplicasUnavailableError
from aeron_spark.connector.formats import Geometry, iter_messages
from aeron_spark.connector.options import parse_archive_source_options
from aeron_spark.connector.source import AeronBatchReader, read_range
from aeron_spark.connector.stores.replicas import ReplicaRange
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.archive.client import (
    ArchiveClient,
    RecordingSignal,
    ReplicationParams,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]
_WAIT_S = 60.0


@dataclass
class Replicas:
    archives: dict[str, aeron_peer.JavaArchive]
    driver: Driver
    primary: ArchiveClient

    @property
    def channels(self) -> list[str]:
        return [a.control_channel for a in self.archives.values()]


@pytest.fixture(scope="module")
def r(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    aeron_peer.require_java()
    root = tmp_path_factory.mktemp("replicas")
    driver = Driver(DriverConfig(directory=root / "driver", write_counters_file=False)).start()
    try:
        with aeron_peer.archive_set(
            root, [("primary", 0x30A), ("second", 0x30B), ("third", 0x30C)]
        ) as archives:
            primary = archives["primary"]
            with ArchiveClient.connect(primary.control_channel, driver, timeout_s=_WAIT_S) as c:
                yield Replicas(archives, driver, c)
    finally:
        driver.close()


def _wait(what: str, condition: object, timeout_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def replicated_stream(r: Replicas, stream_id: int, messages: list[bytes]) -> tuple[object, int]:
    """``messages`` on a live multi-destination publication the primary records and the two
    others replicate with a live merge, all recorded everywhere: (publication, recording id)."""
    live = f"aeron:udp?control=127.0.0.1:{aeron_peer.free_udp_port()}|control-mode=dynamic"
    sub_id = r.primary.start_recording(live, stream_id)
    # 1 MiB terms: a receiver that falls behind can still have what it lost sent again (the
    # publication's flow control follows the fastest receiver, as Aeron's default)
    pub = r.driver.add_publication(live + "|term-length=1048576", stream_id)
    assert pub.wait_until_connected(_WAIT_S)
    rid = r.primary.wait_for_signal(
        lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
    ).recording_id
    half = len(messages) // 2
    publish(r, pub, stream_id, messages[:half], ["primary"])
    for name in ("second", "third"):
        with ArchiveClient.connect(
            r.archives[name].control_channel, r.driver, timeout_s=_WAIT_S
        ) as copy:
            replication = copy.replicate(
                rid,
                r.archives["primary"].control_channel,
                params=ReplicationParams(live_destination=live),
            )
            copy.wait_for_replication(replication, RecordingSignal.MERGE)
    publish(r, pub, stream_id, messages[half:], list(r.archives))
    return pub, rid


def publish(
    r: Replicas, pub: object, stream_id: int, messages: list[bytes], names: list[str]
) -> None:
    """Publish ``messages``, letting the archives ``names`` record every 256 KiB before going
    on (no receiver falls further behind than the publication keeps)."""
    mark = pub.position  # type: ignore[attr-defined]
    for m in messages:
        pub.offer_blocking(m, timeout_s=_WAIT_S)  # type: ignore[attr-defined]
        if pub.position - mark >= 256 * 1024:  # type: ignore[attr-defined]
            recorded(r, stream_id, pub.position, names)  # type: ignore[attr-defined]
            mark = pub.position  # type: ignore[attr-defined]
    recorded(r, stream_id, pub.position, names)  # type: ignore[attr-defined]


def recorded(r: Replicas, stream_id: int, end: int, names: list[str]) -> None:
    """Wait until each archive of ``names`` recorded the stream up to ``end``."""
    for name in names:
        channel = r.archives[name].control_channel
        with ArchiveClient.connect(channel, r.driver, timeout_s=_WAIT_S) as c:
            (d,) = c.list_recordings_for_uri("", stream_id)

            def caught_up(c: ArchiveClient = c, rid: int = d.recording_id) -> bool:
                return max(c.recording_position(rid), c.stop_position(rid)) >= end

            _wait(f"{name} ({channel}) recorded up to {end}", caught_up)


def reader(channels: list[str], stream_id: int, **more: str) -> AeronBatchReader:
    options = {
        "archive": ",".join(channels),
        "streamId": str(stream_id),
        "timeoutMs": "30000",
        **more,
    }
    return AeronBatchReader(parse_archive_source_options(options), None)


def rows_of(parts: list) -> list[tuple[bytes, int, int]]:
    out = []
    for part in parts:
        for batch in read_range(pickle.loads(pickle.dumps(part))):  # as Spark ships them
            d = batch.to_pydict()
            out += list(zip(d["value"], d["position"], d["recording_id"], strict=True))
    return out


def test_a_replicated_recording_reads_the_same_rows_as_the_primary(r: Replicas) -> None:
    messages = [b"row-%05d-" % i + b"z" * (i * 37 % 2500) for i in range(400)]  # some fragmented
    pub, rid = replicated_stream(r, 3601, messages)
    try:
        alone = rows_of(reader(r.channels[:1], 3601).partitions())  # the single-archive form
        assert [v for v, _, _ in alone] == messages
        through = reader(r.channels, 3601)
        parts = through.partitions()
        assert len(parts) == 1 and isinstance(parts[0], ReplicaRange)  # copies: one partition
        assert parts[0].key.startswith("3601/") and parts[0].recording_id == rid
        assert rows_of(parts) == alone
        # Split into shares, and served by another replica first: the same rows.
        assert rows_of(reader(r.channels, 3601, minPartitions="4").partitions()) == alone
        others = [r.channels[2], r.channels[1]]
        served = rows_of(reader(others, 3601).partitions())
        assert [(v, p) for v, p, _ in served] == [(v, p) for v, p, _ in alone]
    finally:
        pub.close()  # type: ignore[attr-defined]


def test_no_archive_able_to_serve_is_a_coded_error_naming_each() -> None:
    nowhere = [f"aeron:udp?endpoint=127.0.0.1:{aeron_peer.free_udp_port()}" for _ in range(2)]
    with pytest.raises(ReplicasUnavailableError) as info:
        reader(nowhere, 3602, timeoutMs="1000").partitions()
    assert info.value.code is ErrorCode.SERVER_UNAVAILABLE
    assert list(info.value.archives) == nowhere
    for channel in nowhere:
        assert channel in str(info.value)
    # nothing listens on those ports: each connect is refused (ICMP port unreachable), not waited
    assert str(info.value).count("ICMP port unreachable") == len(nowhere)


def test_a_task_goes_on_from_the_next_replica_when_its_archive_is_killed(
    r: Replicas, caplog: pytest.LogCaptureFixture
) -> None:
    """Several replay windows of data (1 MiB each): the task has read a little from the primary
    when it is killed; it stalls, then goes on from the second archive where it was, once the
    primary has sent nothing at all (not even heartbeats) for ``SILENCE_S``, long before
    ``timeoutMs`` (a minute here)."""
    caplog.set_level(logging.WARNING, logger="aeron_spark.connector.stores.replicas")
    messages = [b"big-%06d-" % i + b"q" * 1000 for i in range(4000)]  # about 4 MiB
    pub, _ = replicated_stream(r, 3603, messages)
    try:
        (part,) = reader(r.channels, 3603, timeoutMs="60000").partitions()
        part = pickle.loads(pickle.dumps(part))
        with part.store.read(part) as replayed:
            blocks = [next(replayed)]  # read from the primary
            r.archives["primary"].kill()
            blocks += list(replayed)
        assert blocks[0].position == part.start and blocks[-1].end_position == part.end
        for before, after in zip(blocks, blocks[1:], strict=False):
            assert after.position == before.end_position  # no gap, nothing twice
        geometry = Geometry(part.initial_term_id, part.term_length)
        assert [bytes(m.payload) for m in iter_messages(blocks, geometry)] == messages
        failover = [m for m in caplog.messages if "going on from the next replica" in m]
        assert failover and r.archives["primary"].control_channel in failover[0]
        assert "not even a heartbeat" in failover[0]  # silence, not the minute of timeoutMs
        # Planning goes on without the primary: the same partition key, from the others.
        (again,) = reader(r.channels, 3603).partitions()
        assert again.key == part.key and again.end == part.end
    finally:
        pub.close()  # type: ignore[attr-defined]

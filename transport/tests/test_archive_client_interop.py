"""Our archive client against the real Aeron Archive: ``io.aeron.archive.ArchivingMediaDriver``
from the pinned aeron-all jar, started by the fixture with a UDP control channel on a free
port (loopback), sleeping idle strategies, stopped in a ``finally``.

Connect (archive id, protocol version), record a stream our publisher writes and one a real
Java ``RecordedBasicPublisher`` writes, list recordings (all / by URI and stream / one),
positions, bounded replays byte for byte (whole and sub-ranges), open-ended replay, signals,
stop / extend / truncate / purge, and the archive's errors as typed exceptions. Skips without
Java only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import random
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.archive.client import (
    ArchiveActiveRecordingError,
    ArchiveClient,
    ArchiveReplayError,
    ArchiveSessionClosedError,
    ArchiveTimeoutError,
    ArchiveUnknownRecordingError,
    RecordingSignal,
)
from aeron_spark.transport.archive.errors import UnknownRecordingError

sys.path.insert(0, str(Path(__file__).parent))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(180)]
ARCHIVE_ID = 0x5EED
_WAIT_S = 30.0


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aeron_peer.JavaArchive]:
    aeron_peer.require_java()
    directory = tmp_path_factory.mktemp("java-archive")
    with aeron_peer.JavaArchive(directory / "archive", free_udp_port(), ARCHIVE_ID) as peer:
        yield peer


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    d = Driver(
        DriverConfig(directory=tmp_path_factory.mktemp("our-driver"), write_counters_file=False)
    ).start()
    yield d
    d.close()


@pytest.fixture()
def client(archive: aeron_peer.JavaArchive, driver: Driver) -> Iterator[ArchiveClient]:
    with ArchiveClient.connect(archive.control_channel, driver, timeout_s=_WAIT_S) as c:
        yield c


def _record(
    client: ArchiveClient,
    driver: Driver,
    messages: list[bytes],
    stream_id: int,
    *,
    close: bool = True,
    term_length: int = 65536,
) -> tuple[int, int, object, str]:
    """Our publication recorded by the archive: (recording id, end position, pub, channel)."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    sub_id = client.start_recording(channel, stream_id)
    pub = driver.add_publication(channel + f"|term-length={term_length}", stream_id)
    assert pub.wait_until_connected(_WAIT_S)
    start = client.wait_for_signal(
        lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
    )
    for m in messages:
        pub.offer_blocking(m, timeout_s=_WAIT_S)
    end = pub.position
    deadline = time.monotonic() + _WAIT_S
    while client.recording_position(start.recording_id) < end:
        assert time.monotonic() < deadline, "the archive did not record everything"
        time.sleep(0.02)
    if close:
        client.stop_recording_subscription(sub_id)
        client.wait_for_signal(
            lambda e: e.recording_id == start.recording_id and e.signal == RecordingSignal.STOP
        )
        pub.close()
    return start.recording_id, end, pub, channel


def _messages(blocks: list) -> list[bytes]:
    """The messages (fragments reassembled) of replayed blocks."""
    from aeron_spark.connector.client import ReplayBlock
    from aeron_spark.connector.formats import Geometry, iter_messages

    rb = [ReplayBlock(b.position, b.data, 0, b.end_position) for b in blocks]
    return [bytes(m.payload) for m in iter_messages(rb, Geometry(_GEOMETRY[0], _GEOMETRY[1]))]


_GEOMETRY = [0, 65536]


def test_connect_archive_id_and_version(client: ArchiveClient) -> None:
    assert client.archive_id() == ARCHIVE_ID
    assert client.archive_version >> 16 == 1 and client.control_session_id >= 0
    client.keep_alive()
    assert client.archive_id() == ARCHIVE_ID


def test_record_list_positions_and_bounded_replay_byte_for_byte(
    client: ArchiveClient, driver: Driver
) -> None:
    rng = random.Random(21)
    messages = [rng.randbytes(1 + (i * 131) % 4000) for i in range(300)]  # some fragmented
    rid, end, _, channel = _record(client, driver, messages, 2101)
    d = client.list_recording(rid)
    assert d is not None and (d.start_position, d.stop_position) == (0, end)
    assert d.stream_id == 2101 and d.stripped_channel == channel and not d.is_active
    assert rid in [r.recording_id for r in client.list_recordings()]
    assert [r.recording_id for r in client.list_recordings_for_uri(channel, 2101)] == [rid]
    assert client.list_recordings_for_uri(channel, 2102) == []
    assert client.list_recordings(from_recording_id=rid, count=1)[0].recording_id == rid
    assert client.list_recording(rid + 1000) is None
    assert client.stop_position(rid) == end == client.max_recorded_position(rid)
    assert client.recording_position(rid) == -1  # not active any more
    assert client.start_position(rid) == 0
    _GEOMETRY[:] = [d.initial_term_id, d.term_buffer_length]
    blocks = list(client.replay(rid, 0, end, session_id=d.session_id, stream_id=d.stream_id))
    assert blocks[0].position == 0 and blocks[-1].end_position == end
    assert _messages(blocks) == messages
    # Again: the same bytes (the recording's session and stream ids written back over the
    # replay's), and they are the ones of the recorded frames.
    again = list(client.replay(rid, 0, end, session_id=d.session_id, stream_id=d.stream_id))
    assert b"".join(b.data for b in again) == b"".join(b.data for b in blocks)
    first = blocks[0].data
    assert int.from_bytes(first[12:16], "little", signed=True) == d.session_id
    assert int.from_bytes(first[16:20], "little", signed=True) == d.stream_id == 2101
    # A sub-range at message boundaries holds exactly its messages.
    from aeron_spark.connector.client import ReplayBlock
    from aeron_spark.connector.formats import Geometry, iter_messages

    rb = [ReplayBlock(b.position, b.data, 0, b.end_position) for b in blocks]
    starts = [m.position for m in iter_messages(rb, Geometry(d.initial_term_id, 65536))]
    mid = starts[len(starts) // 2]
    head = _messages(list(client.replay(rid, 0, mid)))
    tail = _messages(list(client.replay(rid, mid, end)))
    assert head + tail == messages


def test_open_ended_replay_follows_an_active_recording(
    client: ArchiveClient, driver: Driver
) -> None:
    first = [b"live-%d" % i for i in range(50)]
    rid, end, pub, channel = _record(client, driver, first, 2111, close=False)
    replay_sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", 2112)
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda p, h: got.append(bytes(p)))
    try:
        port = replay_sub.local_endpoints[0][1]
        replay_id = client.start_replay(rid, 0, None, f"aeron:udp?endpoint=127.0.0.1:{port}", 2112)
        later = [b"later-%d" % i for i in range(50)]
        for m in later:
            pub.offer_blocking(m, timeout_s=_WAIT_S)
        deadline = time.monotonic() + _WAIT_S
        while len(got) < 100 and time.monotonic() < deadline:
            replay_sub.wait(0.2)
            replay_sub.poll(assembler, 100)
        assert got == first + later
        client.stop_replay(replay_id)
    finally:
        replay_sub.close()
        client.stop_recording(channel, 2111)
        pub.close()


def test_a_replay_is_sent_a_replay_window_ahead(client: ArchiveClient, driver: Driver) -> None:
    """A replay subscription advertises the client's replay window (1 MiB), not the transport's
    128 KiB default: with only the first frame consumed, the real archive sends exactly one
    window past the start and then waits for our next SM (a replay stalled on a small window
    every ~90 datagrams, at every delay of our receiver or of the archive's idle sleep)."""
    messages = [bytes([i % 251]) * 992 for i in range(2600)]  # 1 KiB frames, ~2.6 MB
    rid, end, _, _ = _record(client, driver, messages, 2161, term_length=4 << 20)
    window = 1 << 20  # the client's default replay_window
    assert end > 2 * window
    replay = client.replay(rid, 0, end, replay_stream_id=2162, block_bytes=1024)
    try:
        first = next(replay)
        assert (first.position, first.end_position) == (0, 1024)

        def received() -> int:
            snapshot = driver.counters.snapshot()
            hwms = [
                v for k, v in snapshot.items() if k.startswith("rcv_hwm:") and k.endswith(":2162")
            ]
            assert len(hwms) == 1, snapshot
            return hwms[0]

        deadline = time.monotonic() + _WAIT_S
        while received() < window and time.monotonic() < deadline:
            time.sleep(0.02)
        assert received() == window, f"the archive sent {received()} bytes, window {window}"
        time.sleep(0.3)  # and no further: the archive keeps to the window we advertise
        assert received() == window
        rest = list(replay)
        assert rest[-1].end_position == end
        assert sum(len(b.data) for b in rest) == end - 1024
    finally:
        replay.close()
    assert client.config.replay_window == window


def test_truncate_purge_and_errors(client: ArchiveClient, driver: Driver) -> None:
    messages = [bytes([i]) * 200 for i in range(100)]
    rid, end, _, _ = _record(client, driver, messages, 2121)
    frame = (32 + 200 + 31) & -32  # each message is one frame
    cut = frame * 10
    client.truncate_recording(rid, cut)
    assert client.stop_position(rid) == cut
    assert _messages(list(client.replay(rid, 0, cut))) == messages[:10]
    with pytest.raises(ArchiveReplayError, match=f"ended at {cut}, before {end}"):
        list(client.replay(rid, 0, end))  # past the end now
    client.purge_recording(rid)
    assert client.list_recording(rid) is None
    with pytest.raises(ArchiveUnknownRecordingError) as info:
        client.stop_position(rid)
    assert isinstance(info.value, UnknownRecordingError)
    assert info.value.error_code == 5 and str(rid) in info.value.error_message
    with pytest.raises(ArchiveUnknownRecordingError):
        client.recording_position(987654)


def test_active_recording_refuses_truncate_and_extend_continues_it(
    client: ArchiveClient, driver: Driver
) -> None:
    rid, end, pub, channel = _record(client, driver, [b"a" * 100] * 10, 2131, close=False)
    try:
        with pytest.raises(ArchiveActiveRecordingError):
            client.truncate_recording(rid, 0)
        assert client.stop_recording_by_identity(rid)
        client.wait_for_signal(lambda e: e.recording_id == rid and e.signal == RecordingSignal.STOP)
        assert client.stop_position(rid) == end
    finally:
        pub.close()


def test_a_real_java_publisher_recorded_and_replayed(
    archive: aeron_peer.JavaArchive, client: ArchiveClient
) -> None:
    """The real ``RecordedBasicPublisher`` (its own AeronArchive client, inside the archive's
    media driver) records "Hello World! <i>" messages; our client lists the recording and
    replays it byte for byte."""
    count, stream_id = 3, 2141
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    props = {
        "aeron.dir": archive.aeron_dir,
        "aeron.sample.channel": channel,
        "aeron.sample.streamId": stream_id,
        "aeron.sample.messages": count,
        "aeron.archive.control.channel": archive.control_channel,
        "aeron.archive.control.response.channel": "aeron:udp?endpoint=127.0.0.1:0",
    }
    program = aeron_peer.PeerProgram(
        aeron_peer.java_argv("io.aeron.samples.archive.RecordedBasicPublisher", props),
        "RecordedBasicPublisher",
    )
    try:
        program.wait_for_line(re.compile("Done sending"), 60)
        program.wait_exit(30)
    finally:
        program.stop()
    (d,) = client.list_recordings_for_uri(channel, stream_id)
    end = client.stop_position(d.recording_id)
    _GEOMETRY[:] = [d.initial_term_id, d.term_buffer_length]
    blocks = list(client.replay(d.recording_id, d.start_position, end))
    got = _messages(blocks)
    assert got == [f"Hello World! {i}".encode() for i in range(count)]


def test_unreachable_archive_times_out_clearly(driver: Driver) -> None:
    aeron_peer.require_java()
    started = time.monotonic()
    with pytest.raises(ArchiveTimeoutError, match="no archive answered"):
        ArchiveClient.connect(
            f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", driver, timeout_s=1.0
        )
    assert time.monotonic() - started < 30  # not a hang (a loaded machine delays the raise)


def test_archive_killed_mid_replay_fails_within_the_timeout(tmp_path: Path, driver: Driver) -> None:
    """kill -9 of the archive while we replay: the replay (and the next request) fail with a
    clear error within the client's timeout, not a hang."""
    aeron_peer.require_java()
    with aeron_peer.JavaArchive(
        tmp_path / "archive", free_udp_port(), 99, tag="archive-kill"
    ) as doomed:
        ArchiveClient.connect(doomed.control_channel, driver, timeout_s=_WAIT_S).close()  # up
        # short, for the failures below to come soon, yet each request of the recording before
        # the kill must be answered within it by a JVM on a loaded machine (2 s was tight)
        timeout_s = 5.0
        client = ArchiveClient.connect(doomed.control_channel, driver, timeout_s=timeout_s)
        try:
            messages = [bytes([i % 256]) * 4000 for i in range(1000)]  # ~4 MB
            rid, end, _, _ = _record(client, driver, messages, 2151)
            replay = client.replay(rid, 0, end)
            next(replay)  # the replay runs
            doomed.kill()
            started = time.monotonic()
            with pytest.raises((ArchiveTimeoutError, ArchiveReplayError), match="recording"):
                for _ in replay:
                    pass
            assert time.monotonic() - started < timeout_s + 10.0  # not a hang
            started = time.monotonic()
            with pytest.raises((ArchiveTimeoutError, ArchiveSessionClosedError), match="archive"):
                client.archive_id()
            assert time.monotonic() - started < timeout_s + 10.0  # not a hang
        finally:
            client.close()

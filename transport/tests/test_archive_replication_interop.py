"""Replication and credentials of our archive client against real Java archives (issue 30).

Three ``io.aeron.archive.ArchivingMediaDriver``s from the pinned aeron-all jar run at once for
the module (sleeping idle strategies, free ports, each its own directories, stopped and removed
by the fixture): ``src`` and ``dst`` (no authentication) and ``auth``, whose authenticator is our
own ``java/TestArchiveAuthenticator.java``, compiled by the test. Our client asks ``dst`` to
replicate recordings of ``src`` (and of ``auth``): a stopped recording up to a stop position, then
extended to its end and found in sync; a live recording merged with the live stream (MERGE) and
followed as it grows; a replication stopped; the archive's errors, synchronous and not; and
connecting with right, wrong and missing credentials and through a challenge, the secret never
shown. Skips without Java only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import logging
import pickle
import random
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.archive.client import (
    ArchiveAuthenticationError,
    ArchiveChallengeError,
    ArchiveClient,
    ArchiveClientConfig,
    ArchiveCredentials,
    ArchiveErrorCode,
    ArchiveReplicationError,
    ArchiveResponseError,
    ArchiveUnknownRecordingError,
    ArchiveUnknownReplicationError,
    ControlConfig,
    RecordingSignal,
    ReplicationParams,
)

sys.path.insert(0, str(Path(__file__).parent))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]
_WAIT_S = 30.0
SIG = RecordingSignal
# A fresh secret per run, so finding it anywhere it should not be means a leak.
SECRET = b"aeron-spark-secret-" + secrets.token_hex(8).encode()


free_udp_port = aeron_peer.free_udp_port


@dataclass
class Archives:
    src: aeron_peer.JavaArchive
    dst: aeron_peer.JavaArchive
    auth: aeron_peer.JavaArchive


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archives]:
    aeron_peer.require_java()
    root = tmp_path_factory.mktemp("replication")
    if aeron_peer.shutil.which("javac") is None:
        message = "no `javac` (a JDK) to compile java/TestArchiveAuthenticator.java"
        if aeron_peer.required():
            pytest.fail(f"{aeron_peer.REQUIRED_ENV} is set but {message}", pytrace=False)
        pytest.skip(message)
    source = (Path(__file__).parent / "java" / "TestArchiveAuthenticator.java").read_text()
    classes = aeron_peer.compile_java(source, "TestArchiveAuthenticator", root / "classes")
    secret_file = root / "secret"
    secret_file.write_bytes(SECRET)
    with aeron_peer.archive_set(
        root,
        [("src", 0x51C), ("dst", 0xD57), ("auth", 0xA07)],
        extra={
            "auth": {
                "aeron.archive.authenticator.supplier": "TestArchiveAuthenticator",
                "aeronspark.test.secret.file": str(secret_file),
            }
        },
        classpaths={"auth": [classes]},
    ) as started:
        yield Archives(started["src"], started["dst"], started["auth"])


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    d = Driver(
        DriverConfig(directory=tmp_path_factory.mktemp("our-driver"), write_counters_file=False)
    ).start()
    yield d
    d.close()


@pytest.fixture()
def src(archives: Archives, driver: Driver) -> Iterator[ArchiveClient]:
    with ArchiveClient.connect(archives.src.control_channel, driver, timeout_s=_WAIT_S) as c:
        yield c


@pytest.fixture()
def dst(archives: Archives, driver: Driver) -> Iterator[ArchiveClient]:
    with ArchiveClient.connect(archives.dst.control_channel, driver, timeout_s=_WAIT_S) as c:
        yield c


def _wait(what: str, condition: object, timeout_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _record(
    client: ArchiveClient,
    driver: Driver,
    messages: list[bytes],
    stream_id: int,
    *,
    close: bool = True,
    channel: str | None = None,
) -> tuple[int, object]:
    """Our publication recorded by the archive: (recording id, publication)."""
    channel = channel or f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    sub_id = client.start_recording(channel, stream_id)
    pub = driver.add_publication(channel + "|term-length=65536", stream_id)
    assert pub.wait_until_connected(_WAIT_S)
    start = client.wait_for_signal(lambda e: e.subscription_id == sub_id and e.signal == SIG.START)
    rid = start.recording_id
    _publish(client, rid, pub, messages)
    if close:
        client.stop_recording_subscription(sub_id)
        client.wait_for_signal(lambda e: e.recording_id == rid and e.signal == SIG.STOP)
        pub.close()
    return rid, pub


def _publish(client: ArchiveClient, rid: int, pub: object, messages: list[bytes]) -> None:
    for m in messages:
        pub.offer_blocking(m, timeout_s=_WAIT_S)  # type: ignore[attr-defined]
    end = pub.position  # type: ignore[attr-defined]
    _wait("the archive recorded everything", lambda: client.recording_position(rid) >= end)


def _frames(client: ArchiveClient, rid: int, end: int) -> bytes:
    """The recording's frames [start, end) as recorded (the recording's own ids written back)."""
    d = client.list_recording(rid)
    assert d is not None
    blocks = client.replay(
        rid, d.start_position, end, session_id=d.session_id, stream_id=d.stream_id
    )
    return b"".join(b.data for b in blocks)


def _messages(client: ArchiveClient, rid: int, end: int) -> list[tuple[int, bytes]]:
    """(position, payload) of every message of the recording up to ``end``."""
    from aeron_spark.connector.client import ReplayBlock
    from aeron_spark.connector.formats import Geometry, iter_messages

    d = client.list_recording(rid)
    assert d is not None
    blocks = [
        ReplayBlock(b.position, b.data, 0, b.end_position)
        for b in client.replay(rid, d.start_position, end)
    ]
    geometry = Geometry(d.initial_term_id, d.term_buffer_length)
    return [(m.position, bytes(m.payload)) for m in iter_messages(blocks, geometry)]


def _identity(client: ArchiveClient, rid: int) -> tuple[int, ...]:
    """What replication keeps of a recording's descriptor."""
    d = client.list_recording(rid)
    assert d is not None
    return (
        d.stream_id,
        d.session_id,
        d.initial_term_id,
        d.start_position,
        d.term_buffer_length,
        d.mtu_length,
    )


def test_replicate_a_stopped_recording_to_a_stop_position_then_extend_it(
    archives: Archives, src: ArchiveClient, dst: ArchiveClient, driver: Driver
) -> None:
    """A stopped recording replicated up to a message boundary in its middle (REPLICATE,
    EXTEND, STOP, REPLICATE_END; no SYNC: the source goes on); then the same destination
    recording extended to the source's end (EXTEND, SYNC, STOP, REPLICATE_END; no new recording),
    with tagged channels; then asked again, already in sync. The bytes are the source's."""
    rng = random.Random(30)
    messages = [rng.randbytes(1 + (i * 97) % 3000) for i in range(400)]  # some fragmented
    rid, _ = _record(src, driver, messages, 3101)
    end = src.stop_position(rid)
    positions = [p for p, _ in _messages(src, rid, end)]
    mid = positions[len(positions) // 2]

    first = dst.replicate(
        rid, archives.src.control_channel, params=ReplicationParams(stop_position=mid)
    )
    status = dst.wait_for_replication(first, SIG.REPLICATE_END, SIG.STOP)
    status = dst.wait_for_replication(first, SIG.STOP)
    status = dst.wait_for_replication(first, SIG.REPLICATE_END)
    assert status.signals[:2] == [SIG.REPLICATE, SIG.EXTEND], status.signals
    assert set(status.signals) == {SIG.REPLICATE, SIG.EXTEND, SIG.STOP, SIG.REPLICATE_END}
    assert status.error is None and status.ended
    copy = status.recording_id
    assert copy >= 0 and dst.stop_position(copy) == mid
    assert _identity(dst, copy) == _identity(src, rid)
    assert _frames(dst, copy, mid) == _frames(src, rid, mid)
    assert [m for _, m in _messages(dst, copy, mid)] == messages[: len(positions) // 2]

    second = dst.replicate(
        rid,
        archives.src.control_channel,
        params=ReplicationParams(
            dst_recording_id=copy, channel_tag_id=7001, subscription_tag_id=7002
        ),
    )
    dst.wait_for_replication(second, SIG.STOP)
    status = dst.wait_for_replication(second, SIG.REPLICATE_END)
    assert SIG.REPLICATE not in status.signals and status.recording_id == copy
    assert {SIG.EXTEND, SIG.SYNC, SIG.STOP} <= set(status.signals), status.signals
    assert dst.stop_position(copy) == end
    assert _frames(dst, copy, end) == _frames(src, rid, end)
    assert [m for _, m in _messages(dst, copy, end)] == messages

    third = dst.replicate(
        rid, archives.src.control_channel, params=ReplicationParams(dst_recording_id=copy)
    )
    status = dst.wait_for_replication(third, SIG.REPLICATE_END)
    assert status.signals[0] == SIG.SYNC and status.position == end  # nothing to copy
    assert dst.stop_position(copy) == end
    # Every signal also went to the general queue, with the replication ids as correlation ids.
    seen = {(e.correlation_id, e.signal) for e in dst.poll_signals()}
    assert {(first, SIG.REPLICATE), (second, SIG.SYNC), (third, SIG.SYNC)} <= seen
    # Purging the copy: a DELETE signal (the files gone).
    dst.purge_recording(copy)
    dst.wait_for_signal(lambda e: e.recording_id == copy and e.signal == SIG.DELETE)


def test_replicate_a_live_recording_and_merge_with_the_live_stream(
    archives: Archives, src: ArchiveClient, dst: ArchiveClient, driver: Driver
) -> None:
    """The source records our multi-destination (dynamic control) publication; ``dst``
    replicates it with that channel as its live destination: it replays, catches up, joins the
    live stream (MERGE), drops the replay and follows the stream as it grows."""
    live = f"aeron:udp?control=127.0.0.1:{free_udp_port()}|control-mode=dynamic"
    stream_id = 3201
    rid, pub = _record(
        src, driver, [b"before-%d" % i for i in range(100)], stream_id, close=False, channel=live
    )
    copy = -1
    try:
        replication = dst.replicate(
            rid, archives.src.control_channel, params=ReplicationParams(live_destination=live)
        )
        _publish(src, rid, pub, [b"during-%d" % i for i in range(100)])
        status = dst.wait_for_replication(replication, SIG.MERGE)
        copy = status.recording_id
        assert status.signals[:2] == [SIG.REPLICATE, SIG.EXTEND], status.signals
        assert SIG.SYNC not in status.signals
        # After the merge the copy grows with the live stream alone.
        _publish(src, rid, pub, [b"after-%d" % i for i in range(100)])
        end = pub.position  # type: ignore[attr-defined]
        _wait("the copy followed the live stream", lambda: dst.recording_position(copy) >= end)
        assert dst.recording_position(copy) == end
        assert _frames(dst, copy, end) == _frames(src, rid, end)
        got = [m for _, m in _messages(dst, copy, end)]
        assert got == (
            [b"before-%d" % i for i in range(100)]
            + [b"during-%d" % i for i in range(100)]
            + [b"after-%d" % i for i in range(100)]
        )
        assert _identity(dst, copy) == _identity(src, rid)
        status = dst.wait_for_replication(replication, SIG.REPLICATE_END)  # over once merged
        assert status.signals == [SIG.REPLICATE, SIG.EXTEND, SIG.MERGE, SIG.REPLICATE_END]
        assert not dst.try_stop_replication(replication)
        # The copy records the live stream until it ends: our publication closed, it stops.
        pub.close()  # type: ignore[attr-defined]
        dst.wait_for_signal(lambda e: e.recording_id == copy and e.signal == SIG.STOP)
        assert dst.stop_position(copy) == end
    finally:
        pub.close()  # type: ignore[attr-defined]
        for client, recording in ((src, rid), (dst, copy)):
            if recording >= 0 and client.recording_position(recording) >= 0:
                client.stop_recording_by_identity(recording)


def test_stop_a_replication(
    archives: Archives, src: ArchiveClient, dst: ArchiveClient, driver: Driver
) -> None:
    """A replication of an active recording without a live destination follows it (an
    open-ended replay) until stopped: STOP and REPLICATE_END, the copy a prefix of the source;
    stopping it again is the archive's UNKNOWN_REPLICATION, ``try_stop_replication`` False."""
    rid, pub = _record(src, driver, [b"x" * 300] * 50, 3301, close=False)
    try:
        replication = dst.replicate(rid, archives.src.control_channel)
        status = dst.wait_for_replication(replication, SIG.EXTEND)
        assert status.signals == [SIG.REPLICATE, SIG.EXTEND]
        copy = status.recording_id
        _publish(src, rid, pub, [b"y" * 300] * 50)
        end = pub.position  # type: ignore[attr-defined]
        _wait("the copy followed the source", lambda: dst.recording_position(copy) >= end)
        dst.stop_replication(replication)
        dst.wait_for_replication(replication, SIG.STOP)
        status = dst.wait_for_replication(replication, SIG.REPLICATE_END)
        assert SIG.SYNC not in status.signals and SIG.MERGE not in status.signals
        assert dst.stop_position(copy) == end
        assert _frames(dst, copy, end) == _frames(src, rid, end)
        with pytest.raises(ArchiveUnknownReplicationError) as info:
            dst.stop_replication(replication)
        assert info.value.archive_code is ArchiveErrorCode.UNKNOWN_REPLICATION
        assert "UNKNOWN_REPLICATION" in str(info.value) and str(replication) in str(info.value)
        assert dst.try_stop_replication(replication) is False
    finally:
        pub.close()  # type: ignore[attr-defined]
        src.stop_recording_by_identity(rid)


def test_replication_errors_are_coded(
    archives: Archives, src: ArchiveClient, dst: ArchiveClient, driver: Driver
) -> None:
    rid, _ = _record(src, driver, [b"z" * 100] * 10, 3401)
    # Refused at once: no such destination recording.
    with pytest.raises(ArchiveUnknownRecordingError, match="unknown destination recording id"):
        dst.replicate(
            rid, archives.src.control_channel, params=ReplicationParams(dst_recording_id=987654)
        )
    # Failed later, by the replication: the source has no such recording.
    unknown = dst.replicate(987654, archives.src.control_channel)
    with pytest.raises(ArchiveUnknownRecordingError, match="unknown src recording id 987654") as e:
        dst.wait_for_replication(unknown, SIG.SYNC)
    assert e.value.details["correlation_id"] == unknown
    assert f"replication {unknown}" in str(e.value)
    with pytest.raises(ArchiveUnknownRecordingError):  # the error stays the replication's answer
        dst.wait_for_replication(unknown, SIG.REPLICATE_END)
    # the error may come before the archive's REPLICATE_END signal (seen in CI): wait for it
    deadline = time.monotonic() + 30
    ended = dst.replication(unknown)
    while not (ended is not None and ended.ended) and time.monotonic() < deadline:
        dst.poll()
        time.sleep(0.01)
        ended = dst.replication(unknown)
    assert ended is not None and ended.signals[-1] == SIG.REPLICATE_END and ended.ended
    # A live merge needs an active source.
    merge = dst.replicate(
        rid,
        archives.src.control_channel,
        params=ReplicationParams(live_destination="aeron:udp?endpoint=127.0.0.1:0"),
    )
    with pytest.raises(ArchiveResponseError, match="cannot live merge") as e:
        dst.wait_for_replication(merge, SIG.MERGE)
    assert e.value.archive_code is ArchiveErrorCode.GENERIC
    errors = dst.poll_errors()
    assert {err.details["correlation_id"] for err in errors} >= {unknown, merge}
    # Waiting for what a finished replication will never send.
    done = dst.replicate(rid, archives.src.control_channel)
    dst.wait_for_replication(done, SIG.REPLICATE_END)
    with pytest.raises(ArchiveReplicationError, match="ended without MERGE"):
        dst.wait_for_replication(done, SIG.MERGE)
    copy = dst.replication(done)
    assert copy is not None and copy.recording_id >= 0
    dst.purge_recording(copy.recording_id)
    for bad in (
        {"stop_position": -2},
        {"live_destination": "udp://x"},
        {"file_io_max_length": 1 << 40},
        {"channel_tag_id": True},
    ):
        with pytest.raises(ConfigurationError):
            ReplicationParams(**bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------- credentials


def _answer(challenge: bytes) -> bytes:
    assert challenge.startswith(b"nonce:")
    return challenge.removeprefix(b"nonce:") + b":" + SECRET


def test_credentials_right_wrong_missing_and_a_challenge(
    archives: Archives, driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    channel = archives.auth.control_channel
    shown: list[str] = []  # everything the failures said

    def refused(credentials: object, error: type[Exception], match: str) -> None:
        with pytest.raises(error, match=match) as info:
            ArchiveClient.connect(channel, driver, timeout_s=_WAIT_S, credentials=credentials)
        shown.extend([str(info.value), repr(info.value), repr(info.value.details)])
        shown.append(str(pickle.loads(pickle.dumps(info.value))))

    # Right: connected, and the session works.
    with ArchiveClient.connect(channel, driver, timeout_s=_WAIT_S, credentials=SECRET) as c:
        assert c.archive_id() == archives.auth.archive_id
        shown.extend([repr(c.config), repr(c.session.config), str(c.session.counters)])
    # Wrong, and missing: the archive's AUTHENTICATION_REJECTED, named, saying what we sent.
    refused(b"wrong-" + SECRET[::-1], ArchiveAuthenticationError, "refused the credentials")
    refused(None, ArchiveAuthenticationError, "AUTHENTICATION_REJECTED.*sent no credentials")
    with pytest.raises(ArchiveAuthenticationError) as info:
        ArchiveClient.connect(channel, driver, timeout_s=_WAIT_S)
    assert info.value.archive_code is ArchiveErrorCode.AUTHENTICATION_REJECTED
    # A challenge round: answered, connected.
    creds = ArchiveCredentials("challenge-me", on_challenge=_answer)
    with ArchiveClient.connect(channel, driver, timeout_s=_WAIT_S, credentials=creds) as c:
        assert c.archive_id() == archives.auth.archive_id
        assert c.session.counters["challenges_answered"] == 1
    # A wrong answer, no way to answer, an answer that fails.
    refused(
        ArchiveCredentials("challenge-me", on_challenge=lambda ch: b"guess:" + SECRET[:4]),
        ArchiveAuthenticationError,
        "refused our answer to its challenge",
    )
    refused(ArchiveCredentials("challenge-me"), ArchiveChallengeError, "no challenge handler")

    def leaky(challenge: bytes) -> bytes:
        raise RuntimeError(f"cannot use {SECRET!r}")

    refused(
        ArchiveCredentials("challenge-me", on_challenge=leaky),
        ArchiveChallengeError,
        r"challenge handler failed \(RuntimeError\)",
    )
    # The secret is nowhere: not in what the failures said, not in the logs.
    shown.append(caplog.text)
    for text in shown:
        assert SECRET.decode() not in text and SECRET[::-1].decode() not in text, text


def test_credentials_are_never_shown(tmp_path: Path) -> None:
    creds = ArchiveCredentials(SECRET, on_challenge=_answer)
    config = ArchiveClientConfig("aeron:udp?endpoint=127.0.0.1:8010", credentials=SECRET)
    assert config.credentials == ArchiveCredentials(SECRET)
    # A config travels to Spark's tasks pickled: the credentials go with it (not shown).
    assert pickle.loads(pickle.dumps(config)).credentials.encoded == SECRET
    params = ReplicationParams(credentials=SECRET, stop_position=64)
    control = ControlConfig("aeron:udp?endpoint=127.0.0.1:1", credentials=creds)
    texts = [repr(creds), str(creds), repr(config), repr(params), repr(control), f"{creds}"]
    assert "ArchiveCredentials(<hidden>)" == repr(creds)
    file = tmp_path / "creds"
    file.write_bytes(SECRET + b"\n")
    assert ArchiveCredentials.from_file(file).encoded == SECRET
    with pytest.raises(ConfigurationError, match="cannot be read") as info:
        ArchiveCredentials.from_file(tmp_path / "missing")
    texts.append(str(info.value))
    with pytest.raises(ConfigurationError) as info:
        ArchiveCredentials(12345)  # type: ignore[arg-type]
    texts.append(str(info.value))
    for text in texts:
        assert SECRET.decode() not in text, text


def test_replicate_from_an_archive_that_authenticates(
    archives: Archives, dst: ArchiveClient, driver: Driver
) -> None:
    """``dst`` connects to the authenticating source as a client: with the credentials in the
    replication's parameters it copies the recording; without, the replication fails with the
    archive's REPLICATION_CONNECTION_FAILURE naming the rejection."""
    with ArchiveClient.connect(
        archives.auth.control_channel, driver, timeout_s=_WAIT_S, credentials=SECRET
    ) as auth:
        rid, _ = _record(auth, driver, [b"guarded-%d" % i for i in range(100)], 3501)
        end = auth.stop_position(rid)
        refused = dst.replicate(rid, archives.auth.control_channel)
        with pytest.raises(ArchiveResponseError, match="authentication rejected") as info:
            dst.wait_for_replication(refused, SIG.SYNC)
        assert info.value.archive_code is ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE
        replication = dst.replicate(
            rid, archives.auth.control_channel, params=ReplicationParams(credentials=SECRET)
        )
        status = dst.wait_for_replication(replication, SIG.SYNC)
        copy = status.recording_id
        dst.wait_for_replication(replication, SIG.STOP)
        assert dst.stop_position(copy) == end
        assert _frames(dst, copy, end) == _frames(auth, rid, end)
        assert SECRET.decode() not in repr(info.value) + str(info.value)

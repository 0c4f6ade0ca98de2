"""The archive control session's sans-I/O core, and our control.xml against the real schema.

The core is driven here with real message bytes, encoded by the same codecs the archive's
answers are decoded with (the SBE engine, from ``control.xml``), and a clock we move by hand;
``test_archive_client_interop.py`` runs the same core against the real Java archive. The last
test reads the schema shipped inside the pinned aeron-all jar and checks every message of ours,
field by field, against it.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from aeron_spark.errors import AeronSparkError, ConfigurationError
from aeron_spark.transport.archive import client as archive_client
from aeron_spark.transport.archive.client import (
    ArchiveChallengeError,
    ArchiveResponseError,
    ArchiveSessionClosedError,
    ArchiveTimeoutError,
    ArchiveUnknownRecordingError,
    ArchiveVersionError,
    ControlConfig,
    ControlSession,
    RecordingSignal,
    SessionState,
    codecs,
)
from aeron_spark.transport.archive.client import errors as archive_errors
from aeron_spark.transport.archive.client.errors import ArchiveErrorCode, ArchiveProtocolError
from aeron_spark.transport.archive.errors import ArchiveError, UnknownRecordingError
from aeron_spark.transport.sbe import parse_schema

sys.path.insert(0, str(Path(__file__).parent))
import aeron_peer  # noqa: E402

MS = 1_000_000
SESSION = 4242


def _response(
    cid: int,
    relevant: int = 0,
    code: int = codecs.OK,
    *,
    session: int = SESSION,
    version: int = codecs.PROTOCOL_SEMANTIC_VERSION,
    message: str = "",
) -> bytes:
    return codecs.encode(
        "ControlResponse",
        controlSessionId=session,
        correlationId=cid,
        relevantId=relevant,
        code=code,
        version=version,
        errorMessage=message,
    )


def _descriptor(cid: int, rid: int, *, session: int = SESSION, stop: int = -1) -> bytes:
    return codecs.encode(
        "RecordingDescriptor",
        controlSessionId=session,
        correlationId=cid,
        recordingId=rid,
        startTimestamp=1,
        stopTimestamp=-1,
        startPosition=0,
        stopPosition=stop,
        initialTermId=7,
        segmentFileLength=1 << 20,
        termBufferLength=65536,
        mtuLength=1408,
        sessionId=99,
        streamId=1001,
        strippedChannel="aeron:udp?endpoint=h:1",
        originalChannel="aeron:udp?endpoint=h:1|term-length=64k",
        sourceIdentity="h:2",
    )


def _connected(timeout_ms: int = 1000, keepalive_ms: int = 100) -> ControlSession:
    s = ControlSession(
        ControlConfig(
            "aeron:udp?endpoint=127.0.0.1:5000",
            message_timeout_ns=timeout_ms * MS,
            keepalive_interval_ns=keepalive_ms * MS,
        )
    )
    data = s.connect(0)
    name, f = codecs.decode(data) or ("", {})
    assert name == "" or f  # a request is not a response: decode() reads only responses
    s.on_message(_response(1, session=SESSION), 1 * MS)
    assert s.connect_result() and s.state is SessionState.CONNECTED
    return s


def test_connect_request_carries_response_channel_stream_and_version() -> None:
    s = ControlSession(ControlConfig("aeron:udp?endpoint=10.0.0.1:6000", response_stream_id=21))
    data = s.connect(0)
    batch, _ = codecs.codec("AuthConnectRequest").decode([data])
    row = batch.to_pylist()[0]
    assert row == {
        "correlationId": 1,
        "responseStreamId": 21,
        "version": (1 << 16) | (11 << 8),
        "responseChannel": "aeron:udp?endpoint=10.0.0.1:6000",
        "encodedCredentials": b"",
    }
    assert not s.connect_result()
    s.on_message(_response(1, session=77), 5)
    assert s.connect_result() and s.control_session_id == 77
    assert s.archive_version == codecs.PROTOCOL_SEMANTIC_VERSION


def test_challenge_is_a_clear_error() -> None:
    s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1"))
    s.connect(0)
    s.on_message(
        codecs.encode(
            "Challenge",
            controlSessionId=5,
            correlationId=1,
            version=0,
            encodedChallenge=b"who are you",
        ),
        1,
    )
    with pytest.raises(ArchiveChallengeError, match="authentication challenge"):
        s.connect_result()
    assert s.state is SessionState.CLOSED
    with pytest.raises(ArchiveSessionClosedError, match="authentication challenge"):
        s.request("ArchiveIdRequest", 2)


def test_credentials_go_in_the_connect_and_a_challenge_is_answered() -> None:
    """The connect carries the encoded credentials; a Challenge is answered (the handler gets
    the challenge bytes) with a ChallengeResponse on a new correlation id, which the archive's
    OK answers; the control session id is the challenge's."""
    seen: list[bytes] = []

    def answer(challenge: bytes) -> bytes:
        seen.append(challenge)
        return b"answer-to-" + challenge

    creds = archive_client.ArchiveCredentials(b"user:pw", on_challenge=answer)
    s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1", credentials=creds))
    data = s.connect(0)
    batch, _ = codecs.codec("AuthConnectRequest").decode([data])
    assert batch.to_pylist()[0]["encodedCredentials"] == b"user:pw"
    s.on_message(
        codecs.encode(
            "Challenge", controlSessionId=9, correlationId=1, version=0, encodedChallenge=b"n1"
        ),
        5 * MS,
    )
    assert seen == [b"n1"] and not s.connect_result()
    (reply,) = s.take_outbox()
    assert s.take_outbox() == []
    batch, _ = codecs.codec("ChallengeResponse").decode([reply])
    row = batch.to_pylist()[0]
    assert row == {"controlSessionId": 9, "correlationId": 2, "encodedCredentials": b"answer-to-n1"}
    s.on_message(_response(1, session=9), 6 * MS)  # the connect's id: no longer the one awaited
    assert not s.connect_result()
    s.on_message(_response(2, session=9), 7 * MS)
    assert s.connect_result() and s.control_session_id == 9
    assert s.counters["challenges_answered"] == 1


def test_a_refused_connect_says_what_was_sent_never_the_credentials() -> None:
    for creds, says in (
        (None, "sent no credentials"),
        (archive_client.ArchiveCredentials("hunter2"), "refused the credentials"),
    ):
        s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1", credentials=creds))
        s.connect(0)
        s.on_message(
            _response(
                1,
                ArchiveErrorCode.AUTHENTICATION_REJECTED,
                codecs.ERROR,
                message="authentication rejected",
            ),
            1,
        )
        with pytest.raises(archive_client.ArchiveAuthenticationError, match=says) as info:
            s.connect_result()
        assert "hunter2" not in str(info.value) + repr(info.value.details)
        assert s.counters["authentication_rejected"] == 1


def test_replication_signals_and_late_errors_are_kept_per_replication() -> None:
    s = _connected()
    p, data = s.request(
        "ReplicateRequest2",
        2 * MS,
        srcRecordingId=3,
        dstRecordingId=-1,
        stopPosition=-1,
        channelTagId=-1,
        subscriptionTagId=-1,
        srcControlStreamId=10,
        fileIoMaxLength=-1,
        replicationSessionId=-1,
        srcControlChannel="aeron:udp?endpoint=h:8010",
        liveDestination="",
        replicationChannel="",
        encodedCredentials=b"",
        srcResponseChannel="",
    )
    assert codecs.template_of(data) == (66, 101)

    def signal(cid: int, rid: int, position: int, sig: int) -> bytes:
        return codecs.encode(
            "RecordingSignalEvent",
            controlSessionId=SESSION,
            correlationId=cid,
            recordingId=rid,
            subscriptionId=-1,
            position=position,
            signal=sig,
        )

    s.on_message(signal(77, 5, 0, RecordingSignal.REPLICATE), 3 * MS)  # overtakes the answer
    s.on_message(_response(p.correlation_id, 77), 3 * MS)
    assert p.value() == 77
    s.on_message(signal(77, 5, 0, RecordingSignal.EXTEND), 4 * MS)
    s.on_message(signal(78, 6, 0, RecordingSignal.EXTEND), 4 * MS)  # not ours to track
    status = s.replications[77]
    assert status.signals == [RecordingSignal.REPLICATE, RecordingSignal.EXTEND]
    assert (status.recording_id, status.ended, status.error) == (5, False, None)
    s.on_message(
        _response(77, ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE, codecs.ERROR, message="x"),
        5 * MS,
    )
    s.on_message(signal(77, 5, -1, RecordingSignal.REPLICATE_END), 5 * MS)
    assert status.ended and status.error is not None
    assert status.error.archive_code is ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE
    assert "replication 77" in str(status.error)
    assert list(s.errors) == [status.error] and s.counters["async_errors"] == 1
    assert len(s.signals) == 4  # every signal is also in the general queue
    snapshot = status.snapshot()
    s.on_message(signal(77, 5, 64, RecordingSignal.STOP), 6 * MS)
    assert len(snapshot.events) == 3 and len(status.events) == 4


def test_connect_refused_and_other_major_version() -> None:
    s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1"))
    s.connect(0)
    s.on_message(
        _response(1, ArchiveErrorCode.AUTHENTICATION_REJECTED, codecs.ERROR, message="no"), 1
    )
    with pytest.raises(ArchiveResponseError) as info:
        s.connect_result()
    assert info.value.archive_code is ArchiveErrorCode.AUTHENTICATION_REJECTED
    s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1"))
    s.connect(0)
    s.on_message(_response(1, version=2 << 16), 1)
    with pytest.raises(ArchiveVersionError, match="2.0.0"):
        s.connect_result()


def test_connect_times_out() -> None:
    s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1", message_timeout_ns=50 * MS))
    s.connect(0)
    assert s.next_deadline_ns() == 50 * MS
    assert s.on_tick(49 * MS) is None and not s.connect_result()
    s.on_tick(50 * MS)
    with pytest.raises(ArchiveTimeoutError, match="50 ms"):
        s.connect_result()
    assert s.counters["timeouts"] == 1


def test_single_response_by_correlation_id_and_typed_errors() -> None:
    s = _connected()
    p1, data = s.request("RecordingPositionRequest", 2 * MS, recordingId=3)
    p2, _ = s.request("ArchiveIdRequest", 2 * MS)
    assert codecs.template_of(data) == (12, 101)
    s.on_message(_response(p2.correlation_id, 555), 3 * MS)  # answers may come in any order
    assert p2.value() == 555 and not p1.done
    s.on_message(
        _response(
            p1.correlation_id,
            ArchiveErrorCode.UNKNOWN_RECORDING,
            codecs.ERROR,
            message="unknown recording id: 3",
        ),
        3 * MS,
    )
    with pytest.raises(ArchiveUnknownRecordingError) as info:
        p1.value()
    err = info.value
    assert isinstance(err, UnknownRecordingError) and isinstance(err, ArchiveError)
    assert isinstance(err, AeronSparkError)
    assert err.error_code == 5 and err.error_message == "unknown recording id: 3"
    assert err.archive_code is ArchiveErrorCode.UNKNOWN_RECORDING
    assert "UNKNOWN_RECORDING" in str(err) and "RecordingPositionRequest" in str(err)
    # An unknown code still maps (generic class, raw code kept).
    p3, _ = s.request("ArchiveIdRequest", 4 * MS)
    s.on_message(_response(p3.correlation_id, 77, codecs.ERROR, message="new"), 4 * MS)
    with pytest.raises(ArchiveResponseError) as info:
        p3.value()
    assert info.value.archive_code == 77


def test_error_survives_pickling() -> None:
    import pickle

    err = ArchiveUnknownRecordingError(
        "m", error_code=5, error_message="x", correlation_id=1, request="r"
    )
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ArchiveUnknownRecordingError and back.error_code == 5


def test_listing_ends_at_count_or_when_the_archive_has_no_more() -> None:
    s = _connected()
    full, _ = s.request(
        "ListRecordingsRequest", 2 * MS, kind="listing", count=2, fromRecordingId=0, recordCount=2
    )
    s.on_message(_descriptor(full.correlation_id, 0), 3 * MS)
    assert not full.done
    s.on_message(_descriptor(full.correlation_id, 1), 3 * MS)
    assert [d.recording_id for d in full.value()] == [0, 1]
    short, _ = s.request(
        "ListRecordingsRequest", 4 * MS, kind="listing", count=10, fromRecordingId=2, recordCount=10
    )
    s.on_message(_descriptor(short.correlation_id, 2, stop=4096), 5 * MS)
    s.on_message(_response(short.correlation_id, 3, codecs.RECORDING_UNKNOWN), 5 * MS)
    (only,) = short.value()
    assert (only.recording_id, only.stop_position, only.is_active) == (2, 4096, False)
    assert only.original_channel.endswith("term-length=64k") and only.stream_id == 1001
    one, _ = s.request("ListRecordingRequest", 6 * MS, kind="one", recordingId=9)
    s.on_message(_response(one.correlation_id, 9, codecs.RECORDING_UNKNOWN), 6 * MS)
    assert one.done and one.value() is None


def test_listing_progress_moves_its_deadline_and_silence_times_out() -> None:
    s = _connected(timeout_ms=100, keepalive_ms=10_000)
    p, _ = s.request(
        "ListRecordingsRequest", 0, kind="listing", count=3, fromRecordingId=0, recordCount=3
    )
    s.on_message(_descriptor(p.correlation_id, 0), 90 * MS)
    s.on_tick(150 * MS)
    assert not p.done and p.error is None  # 90 + 100 > 150
    s.on_tick(190 * MS)
    with pytest.raises(ArchiveTimeoutError, match="ListRecordingsRequest"):
        p.value()


def test_keepalive_when_idle_only() -> None:
    s = _connected(keepalive_ms=100)
    assert s.on_tick(50 * MS) is None
    _, _ = s.request("ArchiveIdRequest", 60 * MS)  # a request counts as activity
    assert s.on_tick(120 * MS) is None
    data = s.on_tick(160 * MS)
    assert data is not None and codecs.template_of(data) == (61, 101)
    assert s.next_deadline_ns() == min(260 * MS, 60 * MS + 1000 * MS)
    assert s.counters["keepalives_sent"] == 1


def test_other_sessions_messages_and_unknown_templates_are_counted_not_taken() -> None:
    s = _connected()
    p, _ = s.request("ArchiveIdRequest", 2 * MS)
    s.on_message(_response(p.correlation_id, 1, session=SESSION + 1), 3 * MS)
    assert not p.done and s.counters["other_session_messages"] == 1
    s.on_message(_response(999, 1), 3 * MS)
    assert s.counters["unmatched_responses"] == 1
    s.on_message(codecs.encode("KeepAliveRequest", controlSessionId=1, correlationId=1), 3 * MS)
    s.on_message(b"\x08\x00\x01\x00\x02\x00\x01\x00" + bytes(8), 3 * MS)  # another schema
    assert s.counters["unknown_messages"] == 2
    with pytest.raises(ArchiveProtocolError):
        s.on_message(b"\x01\x02", 3 * MS)


def test_signals_are_queued_and_overflow_is_counted() -> None:
    s = ControlSession(ControlConfig("aeron:udp?endpoint=127.0.0.1:1", max_queued_signals=2))
    s.connect(0)
    s.on_message(_response(1), 1)
    for i, signal in enumerate((0, 1, 2)):
        s.on_message(
            codecs.encode(
                "RecordingSignalEvent",
                controlSessionId=SESSION,
                correlationId=5,
                recordingId=i,
                subscriptionId=8,
                position=64 * i,
                signal=signal,
            ),
            2,
        )
    assert [(e.recording_id, e.signal) for e in s.signals] == [
        (1, RecordingSignal.STOP),
        (2, RecordingSignal.EXTEND),
    ]
    assert s.counters["signals_dropped"] == 1


def test_close_fails_what_waits_and_refuses_more() -> None:
    s = _connected()
    p, _ = s.request("ArchiveIdRequest", 2 * MS)
    data = s.close()
    assert data is not None and codecs.template_of(data) == (3, 101)
    with pytest.raises(ArchiveSessionClosedError):
        p.value()
    with pytest.raises(ArchiveSessionClosedError, match="closed"):
        s.request("ArchiveIdRequest", 3 * MS)
    assert s.close() is None


def test_config_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="response_channel"):
        ControlConfig("udp://x")
    with pytest.raises(ConfigurationError, match="message_timeout_ns"):
        ControlConfig("aeron:udp?endpoint=h:1", message_timeout_ns=0)


def test_replay_window_is_validated_and_goes_on_the_replay_subscription() -> None:
    from aeron_spark.transport.archive.client import ArchiveClientConfig
    from aeron_spark.transport.uri import ChannelConfig

    archive = "aeron:udp?endpoint=127.0.0.1:8010"
    for bad in (0, 1024, 65535, (64 << 20) + 1, True, 1.5e6):
        with pytest.raises(ConfigurationError, match="replay_window"):
            ArchiveClientConfig(archive, replay_window=bad)
    config = ArchiveClientConfig(archive)
    assert config.replay_window == 1 << 20
    channel = ChannelConfig.from_uri(config.replay_subscription_channel("::1", 0))
    assert channel.receiver_window_length == 1 << 20
    assert channel.so_rcvbuf >= 1 << 20
    assert (channel.endpoint.host, channel.endpoint.port) == ("::1", 0)
    small = ArchiveClientConfig(archive, replay_window=64 * 1024)
    channel = ChannelConfig.from_uri(small.replay_subscription_channel("10.0.0.1", 9))
    assert channel.receiver_window_length == 64 * 1024


# --------------------------------------------------------------- against the real schema


def _real_schema_text() -> str:
    aeron_peer.require_java("the aeron-all jar")
    with zipfile.ZipFile(aeron_peer.jar_path()) as jar:
        return jar.read("archive/aeron-archive-codecs.xml").decode("utf-8")


def test_the_package_exports_every_error_of_its_errors_module_listed_once() -> None:
    assert set(archive_errors.__all__) <= set(archive_client.__all__)
    assert len(archive_client.__all__) == len(set(archive_client.__all__))
    for name in archive_errors.__all__:
        assert getattr(archive_client, name) is getattr(archive_errors, name)


def test_every_message_matches_the_schema_in_the_aeron_jar() -> None:
    real = parse_schema(_real_schema_text())
    ours = codecs.schema()
    assert (ours.id, ours.byte_order) == (real.id, real.byte_order)
    assert ours.version == real.version
    assert [(c.name, c.offset, c.primitive) for c in ours.header.children] == [
        (c.name, c.offset, c.primitive) for c in real.header.children
    ]
    for mine in ours.messages:
        theirs = real.message(mine.id)
        assert theirs.name == mine.name, f"template {mine.id}"
        assert theirs.block_length == mine.block_length, mine.name
        assert theirs.since_version == mine.since_version, mine.name
        assert len(theirs.fields) == len(mine.fields), mine.name
        for a, b in zip(mine.fields, theirs.fields, strict=True):
            what = f"{mine.name}.{a.name}"
            assert (a.name, a.offset, a.primitive, a.size) == (
                b.name,
                b.offset,
                b.primitive,
                b.size,
            ), what
            assert a.since_version == b.since_version, what
            if b.kind == "enum":
                assert a.kind == "enum" and dict(a.values) == dict(b.values), what
        assert [(d.name, d.length_primitive, d.string, d.since_version) for d in mine.data] == [
            (d.name, d.length_primitive, d.string, d.since_version) for d in theirs.data
        ], mine.name

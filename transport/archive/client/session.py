"""The archive control session as a sans-I/O state machine, driven by ``now_ns``.

It builds the requests (bytes to offer on the control request channel), reads the responses
(bytes polled from the response channel), matches them to requests by correlation id, collects
listings, queues recording signals, schedules keep-alives and times out requests whose answer
does not come. No sockets, threads or clocks: :mod:`.client` does the I/O.

    session = ControlSession(ControlConfig(response_channel="aeron:udp?endpoint=...:40000"))
    data = session.connect(now_ns)                   # offer it
    session.on_message(payload, now_ns)              # for every message polled
    session.connect_result()                         # ok / raises / None while waiting
    pending, data = session.request("ArchiveIdRequest", now_ns)
    session.on_tick(now_ns)                          # -> keep-alive bytes to offer, if due
    session.take_outbox()                            # -> bytes the session must send now

Authentication: ``ControlConfig.credentials`` go in the connect request; a ``Challenge`` is
answered (a ``ChallengeResponse`` in the outbox) when the credentials have a challenge handler.
Replications: the id a ``ReplicateRequest2`` answers with is tracked (:class:`ReplicationStatus`):
the recording signals and the asynchronous errors the archive sends with that id as their
correlation id are collected there, and every signal still goes to ``signals``.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field
from typing import Any

from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client import codecs
from aeron_spark.transport.archive.client.credentials import ArchiveCredentials
from aeron_spark.transport.archive.client.errors import (
    ArchiveAuthenticationError,
    ArchiveChallengeError,
    ArchiveClientError,
    ArchiveErrorCode,
    ArchiveProtocolError,
    ArchiveResponseError,
    ArchiveSessionClosedError,
    ArchiveTimeoutError,
    ArchiveVersionError,
    response_error,
)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """How a control session talks to the archive (validated; units in the names)."""

    response_channel: str
    response_stream_id: int = 20
    message_timeout_ns: int = 10_000_000_000  # a request unanswered this long has failed
    keepalive_interval_ns: int = 1_000_000_000  # idle this long: send a keep-alive
    max_queued_signals: int = 4096  # recording signals kept until read (older ones dropped)
    # sent in the connect request; never in repr (nor in any error or log)
    credentials: ArchiveCredentials | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.response_channel, str) or not self.response_channel.startswith(
            "aeron:"
        ):
            raise ConfigurationError(
                "response_channel", self.response_channel, "an aeron: channel URI"
            )
        for name in ("message_timeout_ns", "keepalive_interval_ns", "max_queued_signals"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigurationError(name, value, "a positive integer")
        if not isinstance(self.response_stream_id, int):
            raise ConfigurationError(
                "response_stream_id", self.response_stream_id, "an int32 stream id"
            )
        if self.credentials is not None and not isinstance(self.credentials, ArchiveCredentials):
            raise ConfigurationError(
                "credentials", f"<{type(self.credentials).__name__}>", "ArchiveCredentials"
            )


class SessionState(enum.Enum):
    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class RecordingDescriptor:
    """One recording as the archive's catalog describes it (``stop_position`` is -1 while the
    recording is active)."""

    recording_id: int
    start_timestamp_ms: int
    stop_timestamp_ms: int
    start_position: int
    stop_position: int
    initial_term_id: int
    segment_file_length: int
    term_buffer_length: int
    mtu_length: int
    session_id: int
    stream_id: int
    stripped_channel: str
    original_channel: str
    source_identity: str

    @property
    def is_active(self) -> bool:
        return self.stop_position == codecs.NULL_VALUE

    @classmethod
    def from_fields(cls, f: dict[str, Any]) -> RecordingDescriptor:
        return cls(
            f["recordingId"],
            f["startTimestamp"],
            f["stopTimestamp"],
            f["startPosition"],
            f["stopPosition"],
            f["initialTermId"],
            f["segmentFileLength"],
            f["termBufferLength"],
            f["mtuLength"],
            f["sessionId"],
            f["streamId"],
            f["strippedChannel"] or "",
            f["originalChannel"] or "",
            f["sourceIdentity"] or "",
        )


class RecordingSignal(enum.IntEnum):
    START = 0
    STOP = 1
    EXTEND = 2
    REPLICATE = 3
    MERGE = 4
    SYNC = 5
    DELETE = 6
    REPLICATE_END = 7


@dataclass(frozen=True, slots=True)
class SignalEvent:
    """A recording signal: what happened to ``recording_id`` (``signal``), at ``position``;
    ``correlation_id`` is the request that caused it."""

    correlation_id: int
    recording_id: int
    subscription_id: int
    position: int
    signal: RecordingSignal | int


@dataclass(slots=True)
class ReplicationStatus:
    """What the archive told us about one replication (``replication_id``, the answer to
    ``replicate``): the destination ``recording_id`` (-1 until a REPLICATE or EXTEND signal
    names it), the last signalled ``position``, the signals in order, the archive's error if it
    failed the replication, and whether it ``ended`` (REPLICATE_END)."""

    replication_id: int
    recording_id: int = codecs.NULL_VALUE
    position: int = codecs.NULL_VALUE
    events: list[SignalEvent] = field(default_factory=list)
    error: ArchiveResponseError | None = None
    ended: bool = False

    @property
    def signals(self) -> list[RecordingSignal | int]:
        return [e.signal for e in self.events]

    def seen(self, *signals: RecordingSignal) -> bool:
        """Whether any of ``signals`` came for this replication."""
        return any(e.signal in signals for e in self.events)

    def on_signal(self, event: SignalEvent) -> None:
        self.events.append(event)
        if event.recording_id != codecs.NULL_VALUE:
            self.recording_id = event.recording_id
        if event.position != codecs.NULL_VALUE:
            self.position = event.position
        if event.signal == RecordingSignal.REPLICATE_END:
            self.ended = True

    def snapshot(self) -> ReplicationStatus:
        return ReplicationStatus(
            self.replication_id,
            self.recording_id,
            self.position,
            list(self.events),
            self.error,
            self.ended,
        )


@dataclass(slots=True)
class Pending:
    """A request waiting for its answer. ``kind``: ``single`` (one control response: its
    ``relevantId`` is the result), ``listing`` (descriptors until ``remaining`` reach 0 or the
    archive says there are no more), ``one`` (one descriptor, or None if unknown)."""

    name: str
    correlation_id: int
    kind: str
    deadline_ns: int
    remaining: int = 0
    descriptors: list[RecordingDescriptor] = field(default_factory=list)
    done: bool = False
    result: Any = None
    error: ArchiveClientError | None = None

    def value(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class ControlSession:
    """One control session's protocol state (see the module docstring)."""

    def __init__(self, config: ControlConfig, first_correlation_id: int = 1) -> None:
        self.config = config
        self.state = SessionState.NEW
        self.control_session_id = codecs.NULL_VALUE
        self.archive_version = 0
        self._next_correlation_id = first_correlation_id
        self._connect: Pending | None = None
        self._pending: dict[int, Pending] = {}
        self._last_sent_ns = 0
        self.signals: collections.deque[SignalEvent] = collections.deque()
        # ERROR responses no request waits for (Java's pollForErrorResponse): a replication's
        # failure, mostly; also kept on its ReplicationStatus
        self.errors: collections.deque[ArchiveResponseError] = collections.deque()
        self.replications: dict[int, ReplicationStatus] = {}
        self.outbox: list[bytes] = []  # requests the session made by itself (challenge answer)
        self.counters = collections.Counter[str]()
        self.close_reason = ""
        self._challenged = False

    # -------------------------------------------------------------- requests

    def _correlation_id(self) -> int:
        cid = self._next_correlation_id
        self._next_correlation_id += 1
        return cid

    def connect(self, now_ns: int) -> bytes:
        """The auth-connect request (with the config's credentials, if any) to offer; answered
        through :meth:`connect_result` (a challenge is answered through :meth:`take_outbox`)."""
        if self.state is not SessionState.NEW:
            raise ArchiveSessionClosedError(f"connect() on a session that is {self.state.value}")
        cid = self._correlation_id()
        self.state = SessionState.CONNECTING
        self._connect = Pending("connect", cid, "connect", now_ns + self.config.message_timeout_ns)
        self._last_sent_ns = now_ns
        return codecs.encode(
            "AuthConnectRequest",
            correlationId=cid,
            responseStreamId=self.config.response_stream_id,
            version=codecs.PROTOCOL_SEMANTIC_VERSION,
            responseChannel=self.config.response_channel,
            encodedCredentials=b""
            if self.config.credentials is None
            else self.config.credentials.encoded,
        )

    def take_outbox(self) -> list[bytes]:
        """What the session has to send of its own accord (a challenge's answer), once."""
        out, self.outbox = self.outbox, []
        return out

    def connect_result(self) -> bool:
        """True once connected; False while waiting; raises why the connect failed."""
        if self._connect is None:
            return self.state is SessionState.CONNECTED
        if self._connect.error is not None:
            raise self._connect.error
        return self._connect.done

    def request(
        self, name: str, now_ns: int, *, kind: str = "single", count: int = 0, **fields: Any
    ) -> tuple[Pending, bytes]:
        """A request of template ``name`` (the session and correlation ids are filled in); the
        :class:`Pending` it completes, and the bytes to offer."""
        self._check_connected(name)
        cid = self._correlation_id()
        data = codecs.encode(
            name, controlSessionId=self.control_session_id, correlationId=cid, **fields
        )
        pending = Pending(name, cid, kind, now_ns + self.config.message_timeout_ns, count)
        if kind == "listing" and count <= 0:
            pending.done = True
        else:
            self._pending[cid] = pending
        self._last_sent_ns = now_ns
        return pending, data

    def keepalive(self, now_ns: int) -> bytes:
        self._check_connected("KeepAliveRequest")
        self._last_sent_ns = now_ns
        self.counters["keepalives_sent"] += 1
        return codecs.encode(
            "KeepAliveRequest",
            controlSessionId=self.control_session_id,
            correlationId=self._correlation_id(),
        )

    def close(self, reason: str = "closed by the client") -> bytes | None:
        """The close-session request to offer (None if never connected); every pending
        request fails with :class:`ArchiveSessionClosedError`."""
        was_connected = self.state is SessionState.CONNECTED
        self._fail_all(
            ArchiveSessionClosedError(
                f"archive control session {reason}", control_session_id=self.control_session_id
            )
        )
        self.state = SessionState.CLOSED
        self.close_reason = reason
        if not was_connected:
            return None
        return codecs.encode("CloseSessionRequest", controlSessionId=self.control_session_id)

    def lost(self, reason: str) -> None:
        """The I/O layer saw the archive go (response image gone): fail everything."""
        if self.state is not SessionState.CLOSED:
            self.close(reason)
            self.counters["sessions_lost"] += 1

    def _fail_all(self, error: ArchiveClientError) -> None:
        waiting = list(self._pending.values())
        if self._connect is not None:
            waiting.append(self._connect)
        self._pending.clear()
        for p in waiting:
            if not p.done and p.error is None:
                p.error = error

    def _check_connected(self, name: str) -> None:
        if self.state is not SessionState.CONNECTED:
            why = f": {self.close_reason}" if self.close_reason else ""
            raise ArchiveSessionClosedError(
                f"cannot send {name}: the archive control session is {self.state.value}{why}",
                request=name,
            )

    # -------------------------------------------------------------- time

    def on_tick(self, now_ns: int) -> bytes | None:
        """Expire requests past their deadline; the keep-alive to offer when one is due."""
        timeout_ms = self.config.message_timeout_ns // 1_000_000
        if (
            self._connect is not None
            and not self._connect.done
            and self._connect.error is None
            and now_ns >= self._connect.deadline_ns
        ):
            self.counters["timeouts"] += 1
            self._connect.error = ArchiveTimeoutError(
                f"the archive did not answer the connect request within {timeout_ms} ms "
                f"(response channel {self.config.response_channel})",
                timeout_ms=timeout_ms,
            )
            self.state = SessionState.CLOSED
            self.close_reason = "connect timed out"
        for cid, p in list(self._pending.items()):
            if now_ns >= p.deadline_ns:
                del self._pending[cid]
                self.counters["timeouts"] += 1
                p.error = ArchiveTimeoutError(
                    f"the archive did not answer {p.name} (correlation id {cid}) within "
                    f"{timeout_ms} ms",
                    timeout_ms=timeout_ms,
                    request=p.name,
                    correlation_id=cid,
                )
        if (
            self.state is SessionState.CONNECTED
            and now_ns - self._last_sent_ns >= self.config.keepalive_interval_ns
        ):
            return self.keepalive(now_ns)
        return None

    def next_deadline_ns(self) -> int:
        """When :meth:`on_tick` next has something to do."""
        deadlines = [p.deadline_ns for p in self._pending.values()]
        if self._connect is not None and not self._connect.done:
            deadlines.append(self._connect.deadline_ns)
        if self.state is SessionState.CONNECTED:
            deadlines.append(self._last_sent_ns + self.config.keepalive_interval_ns)
        return min(deadlines) if deadlines else (1 << 63) - 1

    # -------------------------------------------------------------- responses

    def on_message(self, payload: bytes | bytearray | memoryview, now_ns: int) -> None:
        """One message polled from the response channel."""
        try:
            decoded = codecs.decode(payload)
        except ArchiveProtocolError:
            self.counters["undecodable_messages"] += 1
            raise
        if decoded is None:
            self.counters["unknown_messages"] += 1
            return
        name, f = decoded
        if name == "ControlResponse":
            self._on_response(f, now_ns)
        elif name == "RecordingDescriptor":
            self._on_descriptor(f, now_ns)
        elif name == "RecordingSignalEvent":
            self._on_signal(f)
        elif name == "Challenge":
            self._on_challenge(f, now_ns)
        else:
            self.counters["unknown_messages"] += 1

    def _mine(self, f: dict[str, Any]) -> bool:
        if f["controlSessionId"] != self.control_session_id:
            self.counters["other_session_messages"] += 1
            return False
        return True

    def _on_response(self, f: dict[str, Any], now_ns: int) -> None:
        cid, code = f["correlationId"], f["code"]
        c = self._connect
        if c is not None and not c.done and c.error is None and cid == c.correlation_id:
            self._on_connect_response(c, f)
            return
        if not self._mine(f):
            return
        p = self._pending.get(cid)
        if p is None:
            if code == codecs.ERROR:
                self._on_async_error(f)
            else:
                self.counters["unmatched_responses"] += 1
            return
        if code == codecs.ERROR:
            del self._pending[cid]
            p.error = response_error(p.name, int(f["relevantId"]), f["errorMessage"] or "", cid)
            return
        if p.kind == "listing":
            if code == codecs.RECORDING_UNKNOWN:  # no (more) recordings to list
                del self._pending[cid]
                p.done, p.result = True, p.descriptors
                return
            self.counters["unexpected_responses"] += 1
            return
        if p.kind == "one":
            del self._pending[cid]
            if code == codecs.RECORDING_UNKNOWN:
                p.done, p.result = True, None
            else:
                self.counters["unexpected_responses"] += 1
                p.error = ArchiveProtocolError(
                    f"{p.name}: the archive answered code {code} instead of a descriptor",
                    code=code,
                )
            return
        del self._pending[cid]
        p.done, p.result = True, int(f["relevantId"])
        if p.name == "ReplicateRequest2":
            self._track_replication(p.result)

    def _on_async_error(self, f: dict[str, Any]) -> None:
        """An ERROR no request waits for: a replication failing (its id is the correlation id)
        or an answer that came too late. Queued (bounded, overflow counted)."""
        cid = int(f["correlationId"])
        status = self.replications.get(cid)
        what = f"replication {cid}" if status is not None else f"request {cid}"
        error = response_error(what, int(f["relevantId"]), f["errorMessage"] or "", cid)
        self.counters["async_errors"] += 1
        if status is not None and status.error is None:
            status.error = error
        if len(self.errors) >= self.config.max_queued_signals:
            self.errors.popleft()
            self.counters["async_errors_dropped"] += 1
        self.errors.append(error)

    def _track_replication(self, replication_id: int) -> None:
        status = ReplicationStatus(replication_id)
        for event in self.signals:  # any that overtook the answer
            if event.correlation_id == replication_id:
                status.on_signal(event)
        for error in self.errors:
            if error.details.get("correlation_id") == replication_id and status.error is None:
                status.error = error
        self.replications[replication_id] = status
        if len(self.replications) > self.config.max_queued_signals:  # forget the oldest ended
            for rid, old in list(self.replications.items()):
                if old.ended or old.error is not None:
                    del self.replications[rid]
                    self.counters["replications_forgotten"] += 1
                    break

    def _on_connect_response(self, c: Pending, f: dict[str, Any]) -> None:
        if f["code"] != codecs.OK:
            relevant, text = int(f["relevantId"]), f["errorMessage"] or ""
            if relevant == ArchiveErrorCode.AUTHENTICATION_REJECTED:
                self.counters["authentication_rejected"] += 1
                c.error = ArchiveAuthenticationError(
                    "the archive refused our connect (AUTHENTICATION_REJECTED): "
                    f"{text}; {self._credentials_said()}",
                    error_code=relevant,
                    error_message=text,
                    correlation_id=c.correlation_id,
                    request="connect",
                )
            else:
                c.error = response_error("connect", relevant, text, c.correlation_id)
            self.state = SessionState.CLOSED
            self.close_reason = "connect refused"
            return
        version = int(f["version"] or 0)
        major = (version >> 16) & 0xFF
        if major != codecs.PROTOCOL_MAJOR_VERSION:
            c.error = ArchiveVersionError(
                f"the archive speaks control protocol {codecs.semantic_version_text(version)}, "
                f"this client {codecs.semantic_version_text(codecs.PROTOCOL_SEMANTIC_VERSION)} "
                "(major versions differ)",
                archive_version=version,
            )
            self.state = SessionState.CLOSED
            self.close_reason = "protocol version mismatch"
            return
        self.archive_version = version
        self.control_session_id = int(f["controlSessionId"])
        self.state = SessionState.CONNECTED
        c.done, c.result = True, self.control_session_id

    def _credentials_said(self) -> str:
        """What we sent, for an error message (never the credentials themselves)."""
        if self.config.credentials is None:
            return (
                "this client sent no credentials (give ArchiveClientConfig(credentials=...), "
                "or the archiveCredentials / archiveCredentialsFile option)"
            )
        if self._challenged:
            return "the archive refused our answer to its challenge"
        return "the archive refused the credentials this client sent"

    def _on_challenge(self, f: dict[str, Any], now_ns: int) -> None:
        c = self._connect
        if c is None or c.done or c.error is not None or f["correlationId"] != c.correlation_id:
            self.counters["unmatched_responses"] += 1
            return
        challenge = bytes(f["encodedChallenge"] or b"")
        session_id = int(f["controlSessionId"])
        creds = self.config.credentials
        self.counters["challenges"] += 1
        why = ""
        answer = b""
        if creds is None:
            why = "this client sent no credentials and has no way to answer a challenge"
        elif not creds.answers_challenges:
            why = (
                "the credentials given have no challenge handler "
                "(ArchiveCredentials(..., on_challenge=...))"
            )
        else:
            try:
                answer = creds.on_challenge(challenge)
            except Exception as exc:  # the user's function: say which, not what it said
                why = f"the credentials' challenge handler failed ({type(exc).__name__})"
        if why:
            c.error = ArchiveChallengeError(
                "the archive answered our connect with an authentication challenge "
                f"({len(challenge)} bytes): it requires credentials, and {why}",
                control_session_id=session_id,
            )
            self.state = SessionState.CLOSED
            self.close_reason = "authentication challenge"
            return
        self._challenged = True
        self.control_session_id = session_id
        cid = self._correlation_id()
        c.correlation_id = cid  # the archive answers the challenge response's correlation id
        c.deadline_ns = now_ns + self.config.message_timeout_ns
        self._last_sent_ns = now_ns
        self.outbox.append(
            codecs.encode(
                "ChallengeResponse",
                controlSessionId=session_id,
                correlationId=cid,
                encodedCredentials=answer,
            )
        )
        self.counters["challenges_answered"] += 1

    def _on_descriptor(self, f: dict[str, Any], now_ns: int) -> None:
        if not self._mine(f):
            return
        p = self._pending.get(f["correlationId"])
        if p is None or p.kind not in ("listing", "one"):
            self.counters["unmatched_responses"] += 1
            return
        descriptor = RecordingDescriptor.from_fields(f)
        if p.kind == "one":
            del self._pending[p.correlation_id]
            p.done, p.result = True, descriptor
            return
        p.descriptors.append(descriptor)
        p.deadline_ns = now_ns + self.config.message_timeout_ns  # progress
        p.remaining -= 1
        if p.remaining <= 0:
            del self._pending[p.correlation_id]
            p.done, p.result = True, p.descriptors

    def _on_signal(self, f: dict[str, Any]) -> None:
        if not self._mine(f):
            return
        raw = int(f["signal"])
        try:
            signal: RecordingSignal | int = RecordingSignal(raw)
        except ValueError:
            signal = raw
        event = SignalEvent(
            int(f["correlationId"]),
            int(f["recordingId"]),
            int(f["subscriptionId"]),
            int(f["position"]),
            signal,
        )
        status = self.replications.get(event.correlation_id)
        if status is not None:
            status.on_signal(event)
        if len(self.signals) >= self.config.max_queued_signals:
            self.signals.popleft()
            self.counters["signals_dropped"] += 1
        self.signals.append(event)

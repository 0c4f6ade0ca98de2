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
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field
from typing import Any

from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client import codecs
from aeron_spark.transport.archive.client.errors import (
    ArchiveChallengeError,
    ArchiveClientError,
    ArchiveProtocolError,
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
        self.counters = collections.Counter[str]()
        self.close_reason = ""

    # -------------------------------------------------------------- requests

    def _correlation_id(self) -> int:
        cid = self._next_correlation_id
        self._next_correlation_id += 1
        return cid

    def connect(self, now_ns: int) -> bytes:
        """The auth-connect request (no credentials) to offer; answered through
        :meth:`connect_result`."""
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
            encodedCredentials=b"",
        )

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
            self._on_challenge(f)
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

    def _on_connect_response(self, c: Pending, f: dict[str, Any]) -> None:
        if f["code"] != codecs.OK:
            c.error = response_error(
                "connect", int(f["relevantId"]), f["errorMessage"] or "", c.correlation_id
            )
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

    def _on_challenge(self, f: dict[str, Any]) -> None:
        c = self._connect
        if c is None or c.done or c.error is not None or f["correlationId"] != c.correlation_id:
            self.counters["unmatched_responses"] += 1
            return
        c.error = ArchiveChallengeError(
            "the archive answered our connect with an authentication challenge "
            f"({len(f['encodedChallenge'] or b'')} bytes): it requires credentials, and this "
            "client connects without any (configure the archive's authenticator to accept "
            "unauthenticated sessions, e.g. the default NullAuthenticator)",
            control_session_id=int(f["controlSessionId"]),
        )
        self.state = SessionState.CLOSED
        self.close_reason = "authentication challenge"

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
        if len(self.signals) >= self.config.max_queued_signals:
            self.signals.popleft()
            self.counters["signals_dropped"] += 1
        self.signals.append(
            SignalEvent(
                int(f["correlationId"]),
                int(f["recordingId"]),
                int(f["subscriptionId"]),
                int(f["position"]),
                signal,
            )
        )

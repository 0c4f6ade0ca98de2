"""Python client of the stream server's control protocol (used by the Spark source and sink).

```python
from aeron_spark.connector.client import StreamClient, ClientSettings

with StreamClient.connect(ClientSettings(endpoint="127.0.0.1:40123")) as c:
    for rec in c.list_recordings(stream_ids=[10]):
        for block in c.replay(rec.recording_id, rec.purged_position, rec.recorded_position):
            ...  # block.data: raw Aeron DATA frames covering [block.position, block.end_position)
```

One client is one session to the server (one handshake) at a time. A client is not thread-safe;
use one per thread or task. Every wait is bounded by ``settings.timeout_s``. Errors the server
reports are raised as the typed classes of :mod:`aeron_spark.connector.errors`.

A lost session (the server was killed or restarted, the network between them failed for a while:
:class:`~aeron_spark.connector.errors.SessionLostError`) is replaced by a new one, for as long as
``timeout_s`` allows, and the operation goes on where it was: a request whose reply did not come
is sent again (every request but ``publish`` and ``local_stage_done`` may be: the server's
commit is idempotent by sink id and batch id, the others read or recreate), a replay resumes at
the end of the last block it delivered, and :meth:`StreamClient.stage` stages its part again
from the payloads it kept (up to ``RESTAGE_BUFFER_BYTES``). Only when no new session answers
within ``timeout_s`` (or a stage kept too little to restart) is :class:`ServerUnavailableError`
raised, naming the endpoint and the loss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aeron_spark.connector import local as local_io
from aeron_spark.connector.errors import (
    ConnectorError,
    ControlProtocolError,
    PayloadTooLargeError,
    ServerUnavailableError,
    SessionLostError,
    error_from_wire,
)
from aeron_spark.connector.runs import PayloadRun
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto
from aeron_spark.connector.session.link import Link, open_client_link
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.session.settings import ClientSettings
from aeron_spark.counters import REGISTRY, CounterType, counter_set
from aeron_spark.errors import ConfigurationError
from aeron_spark.handshake.client_counters import handshake_client_counters
from aeron_spark.handshake.errors import TooManyConnectionsError, TooManyForKeyError
from aeron_spark.transport import Driver
from aeron_spark.transport.protocol.logbuffer import TERM_MIN_LENGTH, max_message_length

log = logging.getLogger(__name__)

#: Payload bytes :meth:`StreamClient.stage` keeps to stage its part again on a new session after
#: the old one was lost; a larger part is not restaged (the task fails and Spark retries it).
RESTAGE_BUFFER_BYTES = 256 * 1024 * 1024
#: Requests never sent again on a new session: a publish may already be recorded (it would be
#: recorded twice), a ``local_stage_done`` names a part the new session does not own (stage()
#: restages it whole instead).
_NOT_RETRIED = frozenset({"publish", "stage", "local_stage_done", "stop_replay", "keepalive"})
#: Every server takes a message this long (the smallest term's limit): a publish of messages
#: no longer asks the server for its limit.
_ALWAYS_FITS = max_message_length(TERM_MIN_LENGTH)
#: What a request counts a payload beyond its bytes (its msgpack bin header and list slot,
#: generously): ``batched``'s overhead.
_PAYLOAD_OVERHEAD = 16
#: Pauses between reconnect attempts (as Kafka's reconnect.backoff.ms and
#: reconnect.backoff.max.ms): the first after 50 ms, doubling to at most 1 s, each one drawn
#: within +-20% (``RECONNECT_JITTER``) so a process whose sessions were all lost at once (a long
#: pause) does not retry them in lockstep against the server's pending-handshake limits.
RECONNECT_BACKOFF_S = 0.05
RECONNECT_BACKOFF_MAX_S = 1.0
RECONNECT_JITTER = 0.2
#: Refusals a reconnect waits out (see :meth:`StreamClient._reconnect`).
_REFUSED_FOR_NOW = (TooManyConnectionsError, TooManyForKeyError)


class _ReplayOverrun(Exception):
    """A replay's unread blocks were dropped (``max_queued_replay_bytes``): its iterator asks
    for it again from the last block it delivered. Never leaves the client."""


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What :meth:`StreamClient.scan` found: ``end`` (a message boundary), whole ``messages`` in
    ``[start, end)`` and ``splits`` (message boundaries strictly inside it)."""

    end: int
    messages: int
    splits: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RecordingInfo:
    recording_id: int
    stream_id: int
    session_id: int
    source: str
    start_position: int
    stop_position: int | None
    recorded_position: int
    purged_position: int
    start_timestamp_ns: int
    term_length: int
    mtu: int
    initial_term_id: int
    # the last message boundary at or below recorded_position (None: a server before it)
    message_end: int | None = None

    @classmethod
    def from_wire(cls, item: Any) -> RecordingInfo:
        try:
            fields = {name: item[name] for name in cls.__slots__ if name != "message_end"}  # type: ignore[attr-defined]
            end = item.get("message_end")
            return cls(**fields, message_end=None if end is None else int(end))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlProtocolError(f"malformed recording description {item!r:.200}") from exc


@dataclass(frozen=True, slots=True)
class RecordingPosition:
    """One recording's positions from the server's catalog (no data scanned): ``message_end``
    is the last message boundary at or below ``recorded_position`` (the readable end), where a
    micro-batch without a message limit may end."""

    recording_id: int
    stream_id: int
    start_position: int
    purged_position: int
    recorded_position: int
    message_end: int
    stop_position: int | None

    @classmethod
    def from_wire(cls, row: Any) -> RecordingPosition:
        try:
            rid, stream, start, purged, recorded, end, stop = row
            return cls(
                int(rid),
                int(stream),
                int(start),
                int(purged),
                int(recorded),
                int(end),
                None if stop is None else int(stop),
            )
        except (TypeError, ValueError) as exc:
            raise ControlProtocolError(f"malformed recording position {row!r:.200}") from exc


@counter_set(CounterType.CLIENT)
@dataclass(slots=True)
class ClientCounters:
    """A stream client's counts (all kept, never reset): what it replaced, retried and read."""

    reconnects: int = 0  # sessions opened to replace a lost one
    reconnect_retries: int = 0  # attempts to replace one that failed and were retried
    restages: int = 0  # parts staged again on a new session
    replay_resumes: int = 0  # replays resumed on a new session
    replay_overruns: int = 0  # replays whose unread blocks passed max_queued_replay_bytes
    messages_refused: int = 0  # publishes refused before sending: a message over the limit
    local_reads: int = 0  # ranges read from the server's files (see connector.local)
    local_stages: int = 0  # sink parts written into the server's directory
    replays: int = 0  # ranges replayed over the session


class _Counted:
    """``client.<name>``: the client's registry counter of that name (read only)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, client: Any, owner: type | None = None) -> int:
        return int(getattr(client.counters, self.name))


class StreamClient:
    """One session to a stream server. Use :meth:`connect`.

    Its counts are registry counters (``CounterType.CLIENT``): :meth:`client_counters` gives
    them all, each is also an attribute (``client.reconnects``)."""

    reconnects = _Counted()
    reconnect_retries = _Counted()
    restages = _Counted()
    replay_resumes = _Counted()
    replay_overruns = _Counted()
    messages_refused = _Counted()
    local_reads = _Counted()
    local_stages = _Counted()
    replays = _Counted()

    def __init__(self, link: Link, settings: ClientSettings, driver: Driver | None = None) -> None:
        self._link = link
        self.settings = settings
        self._driver = driver  # new sessions go over it too (None: the shared driver)
        self._ids = itertools.count(1)
        self._payload_ids = itertools.count(1)
        self._replies: dict[int, proto.Reply] = {}
        self._replay_queues: dict[int, deque[Any]] = {}
        # bytes of blocks waiting in each replay's queue, and the replays whose unread blocks
        # passed settings.max_queued_replay_bytes (dropped, stopped: asked again when read)
        self._replay_bytes: dict[int, int] = {}
        self._overrun: set[int] = set()
        self._reading: int | None = None  # the replay whose iterator waits for a block now
        self._abandoned: set[int] = set()
        self._reassembler = chunking.Reassembler()
        self._last_send = time.monotonic()
        self._session_error: ConnectorError | None = None
        self.counters = ClientCounters()  # declared in the counter registry (CLIENT)
        self._generation = 0  # sessions replaced so far: a replay of an older one is dead
        self._outstanding: set[int] = set()  # requests sent, reply not yet taken
        self._in_operation = False  # a multi-request publish/stage is running
        self._ignored_replies: set[int] = set()  # replies to fire-and-forget stop_replay
        self._closed = False
        self._limits: dict[int, int] = {}  # stream -> its largest message (this session's server)

    @classmethod
    def connect(cls, settings: ClientSettings | str, driver: Driver | None = None) -> StreamClient:
        """A client with a session to ``settings.endpoint``, over ``driver`` (None: the
        process's shared driver; a driver of the caller's own sets its transport timeouts, as
        ``DriverConfig.publication_connection_timeout_ns``, which bound how soon a lost session
        is seen lost)."""
        if isinstance(settings, str):
            settings = ClientSettings(endpoint=settings)
        return cls(open_client_link(settings, driver), settings, driver)

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._link.close()

    @property
    def max_message_length(self) -> int:
        return self._link.max_message_length

    def client_counters(self) -> dict[str, int]:
        """This client's counters by name (``CounterType.CLIENT`` in the registry), with the
        process's handshake client counters (``slot_timeouts``, ``key_store_lock_timeouts``)."""
        return REGISTRY.snapshot(CounterType.CLIENT, self.counters) | handshake_client_counters()

    # --- plumbing -----------------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self.settings.timeout_s

    def _send(self, message: bytes | Sequence[bytes | bytearray | memoryview]) -> None:
        """Send one message, given whole or as parts (``proto.encode_request_parts``): parts
        are cut into chunks as they go, never joined, so a large payload is not copied."""
        if self._closed:
            raise ServerUnavailableError("the client is closed")
        parts = (message,) if isinstance(message, bytes) else message
        limit = self._link.max_message_length
        deadline = self._deadline()
        if sum(map(len, parts)) <= limit:
            self._link.send(parts[0] if len(parts) == 1 else b"".join(parts), deadline)
        else:
            for chunk in chunking.split_parts(parts, limit, next(self._payload_ids)):
                self._link.send(chunk, deadline)
        self._last_send = time.monotonic()

    def _reconnect_if_idle_and_lost(self) -> None:
        """A session the server closed (lease expiry while we were idle, a server restart) is
        replaced by a new one before the next request, never halfway through a pipelined
        publish or stage (a replay of the old session notices and resumes on the new one)."""
        if self._closed or self._link.is_connected:
            return
        if self._in_operation:  # a publish or stage halfway: its caller decides
            raise SessionLostError(
                f"the session to {self.settings.endpoint} was lost during an operation"
            )
        self._reconnect(
            self._deadline(),
            SessionLostError(f"the idle session to {self.settings.endpoint} was lost"),
        )

    def _may_retry(self, op: str, deadline: float) -> bool:
        return op not in _NOT_RETRIED and not self._closed and time.monotonic() < deadline

    def _reconnect(self, deadline: float, cause: BaseException) -> None:
        """Replace a lost session by a new one, trying until ``deadline``. What was in flight
        on the old session is forgotten: its callers send it again on the new one."""
        self._link.close()
        self._generation += 1
        self._replies.clear()
        self._replay_queues.clear()
        self._replay_bytes.clear()
        self._overrun.clear()
        self._outstanding.clear()
        self._abandoned.clear()
        self._ignored_replies.clear()
        self._session_error = None
        self._reassembler = chunking.Reassembler()
        self._limits.clear()  # the new session's server may be another (a restart)
        attempts = 0
        pause = RECONNECT_BACKOFF_S
        last: BaseException = cause
        while not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            attempt = dataclasses.replace(
                self.settings, timeout_s=min(remaining, self.settings.connect_attempt_timeout_s)
            )
            try:
                self._link = open_client_link(attempt, self._driver)
            except (SessionLostError, ServerUnavailableError) as exc:
                # not back yet, or busy: the server's pending handshakes full (TOO_MANY_PENDING),
                # or its connection limits still counting the sessions being replaced (until
                # their leases end: TOO_MANY_FROM_ADDRESS, TOO_MANY_FOR_KEY); other refusals
                # are raised as they are
                if not isinstance(exc, SessionLostError) and not isinstance(
                    exc.__cause__, _REFUSED_FOR_NOW
                ):
                    raise
                last = exc
                self.counters.reconnect_retries += 1
                jitter = 1.0 + RECONNECT_JITTER * (2.0 * random.random() - 1.0)
                time.sleep(min(pause * jitter, max(deadline - time.monotonic(), 0.0)))
                pause = min(pause * 2, RECONNECT_BACKOFF_MAX_S)
                continue
            self._last_send = time.monotonic()
            self.counters.reconnects += 1
            return
        raise ServerUnavailableError(
            f"the session to {self.settings.endpoint} was lost ({cause}) and no new one "
            f"could be opened within {self.settings.timeout_s} s ({attempts} attempts; last: "
            f"{last})"
        ) from last

    def _send_request(self, op: str, args: dict[str, Any], whole: bool = False) -> int:
        """Send a request; ``whole``: its payloads are small (``_fits_one_request``), encoded
        in one piece rather than as parts."""
        if op not in ("stop_replay", "keepalive"):
            self._reconnect_if_idle_and_lost()
        request_id = next(self._ids) & proto.MAX_REQUEST_ID or next(self._ids)
        if whole:
            self._send(proto.encode_request(request_id, op, args))
        else:
            self._send(proto.encode_request_parts(request_id, op, args))
        if op != "stop_replay":
            self._outstanding.add(request_id)
        return request_id

    def _receive_one(self, deadline: float) -> bool:
        """Receive and route one message; False if nothing arrived before ``deadline``."""
        now = time.monotonic()
        if now - self._last_send >= self.settings.keepalive_interval_s:
            self._send(proto.encode_request(0, "keepalive", {}))
        wait_until = min(deadline, self._last_send + self.settings.keepalive_interval_s)
        message: bytes | bytearray | None = self._link.receive(wait_until)
        if message is None:
            if not self._link.is_connected:
                raise SessionLostError(
                    f"the session to {self.settings.endpoint} was closed by the server or lost"
                )
            return False
        kind = message[0] if len(message) else -1
        if kind == proto.KIND_CHUNK:
            whole = self._reassembler.feed(message, time.monotonic_ns())
            if whole is None:
                return True
            message = whole
            kind = message[0]
        if kind == proto.KIND_REPLAY_DATA:
            rid, position, end, ts, frames = proto.decode_replay_data(message)
            queue = self._replay_queues.get(rid)
            if queue is not None:
                # one bound for all the client's replays together; only the replay being read,
                # waiting for its next block, takes one past it (so it always moves on)
                total = sum(self._replay_bytes.values()) + len(frames)
                if total > self.settings.max_queued_replay_bytes and (
                    queue or rid != self._reading
                ):
                    self._overrun_replay(rid, queue)
                else:
                    self._replay_bytes[rid] = self._replay_bytes.get(rid, 0) + len(frames)
                    queue.append(ReplayBlock(position, frames, ts, end))
            elif rid not in self._abandoned:
                raise ControlProtocolError(f"replay data for unknown replay {rid}")
            return True
        reply = proto.decode_reply(message)
        if reply.event == "replay_end":
            queue = self._replay_queues.get(reply.id)
            if queue is not None:
                queue.append(reply)
            self._abandoned.discard(reply.id)
            return True
        if reply.id == 0:
            if not reply.ok:  # a request too broken to have an id: fail the next call
                self._session_error = error_from_wire(reply.error)
            return True
        if reply.id in self._ignored_replies:
            self._ignored_replies.discard(reply.id)
            return True
        self._replies[reply.id] = reply
        return True

    def _overrun_replay(self, rid: int, queue: deque[Any]) -> None:
        """Replay ``rid``'s unread blocks would pass ``max_queued_replay_bytes`` (the client
        reads the session for other calls while nobody reads the replay): drop them and stop
        the replay; its iterator asks for it again from its last delivered block when it is
        read next (:meth:`_resuming_replay`), so memory stays bounded and nothing is lost."""
        queue.clear()
        self._replay_queues.pop(rid, None)
        self._replay_bytes.pop(rid, None)
        self._overrun.add(rid)
        self.counters.replay_overruns += 1
        self._send_stop_replay(rid)

    def _send_stop_replay(self, rid: int) -> None:
        """Stop replay ``rid`` without waiting: its late blocks and end are dropped on arrival."""
        self._abandoned.add(rid)
        stop_id = next(self._ids) & proto.MAX_REQUEST_ID
        self._ignored_replies.add(stop_id)  # nobody waits for it: drop it on arrival
        try:
            self._send(proto.encode_request(stop_id, "stop_replay", {"replay_id": rid}))
        except ConnectorError:
            pass  # the session is gone; the server's lease ends the replay

    def _wait_reply(self, request_id: int, deadline: float | None = None) -> Any:
        deadline = deadline if deadline is not None else self._deadline()
        while request_id not in self._replies:
            if self._session_error is not None:
                error, self._session_error = self._session_error, None
                raise error
            if not self._receive_one(deadline) and time.monotonic() >= deadline:
                raise ServerUnavailableError(
                    f"no reply from {self.settings.endpoint} within {self.settings.timeout_s} s"
                )
        reply = self._replies.pop(request_id)
        self._outstanding.discard(request_id)
        if not reply.ok:
            raise error_from_wire(reply.error)
        return reply.result

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its result (raises the typed error on failure). A lost
        session is replaced and the request sent again (not ``publish`` nor
        ``local_stage_done``) until ``timeout_s`` after the call began."""
        deadline = self._deadline()
        while True:
            try:
                return self._wait_reply(self._send_request(op, args), deadline)
            except SessionLostError as exc:
                if not self._may_retry(op, deadline):
                    raise
                log.info("%s: %s; reconnecting to send %s again", self.settings.endpoint, exc, op)
                self._reconnect(deadline, exc)

    # --- operations ---------------------------------------------------------------------------

    def list_streams(self) -> list[dict[str, Any]]:
        return list(self.call("list_streams"))

    def list_recordings(self, stream_ids: Sequence[int] | None = None) -> list[RecordingInfo]:
        args = {} if stream_ids is None else {"stream_ids": [int(s) for s in stream_ids]}
        return [RecordingInfo.from_wire(item) for item in self.call("list_recordings", **args)]

    def latest_positions(self, stream_ids: Sequence[int] | None = None) -> dict[int, int]:
        args = {} if stream_ids is None else {"stream_ids": [int(s) for s in stream_ids]}
        return {int(rid): int(pos) for rid, pos in self.call("latest_positions", **args)}

    def recording_positions(
        self, stream_ids: Sequence[int] | None = None
    ) -> dict[int, RecordingPosition]:
        """Every recording of ``stream_ids`` (None: all) with its positions, in one request and
        without scanning recorded data: what ``latestOffset`` needs when no trigger limit asks
        for message counts (then :meth:`scan_ranges`)."""
        args = {} if stream_ids is None else {"stream_ids": [int(s) for s in stream_ids]}
        rows = self.call("recording_positions", **args)
        return {p.recording_id: p for p in map(RecordingPosition.from_wire, rows)}

    def scan_ranges(
        self,
        ranges: Sequence[tuple[int, int, int]],
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
    ) -> list[tuple[int, int]]:
        """``(end, messages)`` per ``(recording_id, start, end)`` of ``ranges``, in one request:
        each end a message boundary at most the range's end, within ``max_messages`` /
        ``max_bytes`` shared by all the ranges (evenly between those with data first, then
        what is left in the order given), and the whole messages before it."""
        args: dict[str, Any] = {"ranges": [[int(r), int(s), int(e)] for r, s, e in ranges]}
        for name, value in (("max_messages", max_messages), ("max_bytes", max_bytes)):
            if value is not None:
                args[name] = int(value)
        return [(int(end), int(count)) for end, count in self.call("scan_ranges", **args)]

    def scan(
        self,
        recording_id: int,
        start: int,
        end: int | None = None,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        parts: int = 1,
    ) -> ScanResult:
        """Whole messages from ``start`` (a message boundary): where ``[start, end)`` may end
        within the limits without tearing a message, how many messages that is, and up to
        ``parts - 1`` message boundaries splitting it evenly. ``end=None``: the recorded end."""
        args: dict[str, Any] = {"recording_id": recording_id, "start": start, "parts": parts}
        for name, value in (("end", end), ("max_messages", max_messages), ("max_bytes", max_bytes)):
            if value is not None:
                args[name] = int(value)
        result = self.call("scan", **args)
        return ScanResult(
            int(result["end"]), int(result["messages"]), tuple(int(p) for p in result["splits"])
        )

    def position_at(self, recording_id: int, timestamp_ns: int) -> int:
        return int(self.call("position_at", recording_id=recording_id, timestamp_ns=timestamp_ns))

    def read_range(
        self, recording_id: int, start: int, end: int, *, local: bool = True
    ) -> Iterator[ReplayBlock]:
        """Blocks covering exactly ``[start, end)``: read from the server's segment files when
        ``local`` and this process sees them (see :mod:`~aeron_spark.connector.local`; the
        server checks the range first), else replayed over the session. Same blocks' rows
        either way."""
        if local:
            where = self.call("local_read", recording_id=recording_id, start=start, end=end)
            if where is not None and local_io.sees_server_files(where):
                self.counters.local_reads += 1
                return local_io.read_blocks(where["directory"], recording_id, start, end)
        self.counters.replays += 1
        return self.replay(recording_id, start, end)

    def read_ranges(
        self, ranges: Sequence[tuple[int, int, int]], *, local: bool = True
    ) -> Iterator[Iterator[ReplayBlock]]:
        """One iterator of blocks per ``(recording_id, start, end)`` of ``ranges``, in order,
        each covering exactly its range as :meth:`read_range` would (the same blocks' rows), and
        each to be read before the next is taken. One request for them all (a packed input
        partition's ranges, issue 31 item 2): ``local_read_ranges`` when ``local`` and this
        process sees the server's files, else one ``replay_ranges``; a server before control
        protocol version 3 gets a request a range (:meth:`read_range` each)."""
        ranges = [(int(r), int(s), int(e)) for r, s, e in ranges]
        if not ranges:
            return iter(())
        if len(ranges) > proto.MAX_POSITIONS:  # more than one request carries: one by one
            return self._read_each(ranges, local)
        wire = [list(r) for r in ranges]
        if local:
            try:
                where = self.call("local_read_ranges", ranges=wire)
            except ControlProtocolError:  # "unknown operation": a server before version 3
                return self._read_each(ranges, local)
            if where is not None and local_io.sees_server_files(where):
                directories = where["directories"]
                if not isinstance(directories, list) or len(directories) != len(ranges):
                    raise ControlProtocolError(
                        f"local_read_ranges: {len(ranges)} ranges asked, answer {where!r:.200}"
                    )
                self.counters.local_reads += len(ranges)
                return (
                    local_io.read_blocks(str(d), r, s, e)
                    for d, (r, s, e) in zip(directories, ranges, strict=True)
                )
        try:
            request_id = self._start_replay_ranges(ranges, self._deadline())
        except ControlProtocolError:  # "unknown operation": a server before version 3
            return self._read_each(ranges, False)
        self.counters.replays += 1
        return _per_range(len(ranges), self._resuming_replay_ranges(ranges, request_id))

    def _read_each(
        self, ranges: list[tuple[int, int, int]], local: bool
    ) -> Iterator[Iterator[ReplayBlock]]:
        for recording_id, start, end in ranges:
            yield self.read_range(recording_id, start, end, local=local)

    def _start_replay_ranges(self, ranges: list[tuple[int, int, int]], deadline: float) -> int:
        args = {"ranges": [list(r) for r in ranges]}
        return self._start_replay_request("replay_ranges", args, deadline)

    def _resuming_replay_ranges(
        self, ranges: list[tuple[int, int, int]], request_id: int
    ) -> Iterator[tuple[int, ReplayBlock]]:
        """``(index of its range, block)`` of one ``replay_ranges``; on a lost session, a new
        one replays the rest from the end of the last block delivered (no block twice, none
        skipped)."""
        at, position = 0, ranges[0][1]

        def settle() -> None:  # past the ranges read to their end
            nonlocal at, position
            while at < len(ranges) and position >= ranges[at][2]:
                at += 1
                if at < len(ranges):
                    position = ranges[at][1]

        while True:
            settle()
            rest: list[tuple[int, int | None]] = [(s, e) for _, s, e in ranges[at + 1 :]]
            if at < len(ranges):
                rest.insert(0, (position, ranges[at][2]))
            blocks = self._replay_blocks(request_id, rest or [(ranges[-1][2], ranges[-1][2])])
            try:
                for block in blocks:
                    settle()
                    position = block.end_position
                    yield at, block
                return
            except _ReplayOverrun:
                # its unread blocks were dropped while other calls ran: ask again from here
                settle()
                if at >= len(ranges):
                    return
                rest_ranges = [(ranges[at][0], position, ranges[at][2]), *ranges[at + 1 :]]
                request_id = self._start_replay_ranges(rest_ranges, self._deadline())
            except SessionLostError as exc:
                if self._closed:
                    raise
                settle()
                if at >= len(ranges):
                    return  # every block came; only the end marker was lost
                deadline = self._deadline()
                log.info(
                    "%s: %s; resuming the replay of %d ranges at recording %d position %d",
                    self.settings.endpoint,
                    exc,
                    len(ranges) - at,
                    ranges[at][0],
                    position,
                )
                self._reconnect(deadline, exc)
                rest_ranges = [(ranges[at][0], position, ranges[at][2]), *ranges[at + 1 :]]
                request_id = self._start_replay_ranges(rest_ranges, deadline)
                self.counters.replay_resumes += 1
            finally:
                blocks.close()

    def replay(self, recording_id: int, start: int, end: int | None) -> Iterator[ReplayBlock]:
        """Blocks covering exactly ``[start, end)``; ``end=None`` follows the live recording
        until the iterator is closed (or the recording stops). The request is sent and checked
        eagerly, so a bad range raises here, not at the first ``next``."""
        request_id = self._start_replay(recording_id, start, end, self._deadline())
        return self._resuming_replay(recording_id, start, end, request_id)

    def _start_replay(self, recording_id: int, start: int, end: int | None, deadline: float) -> int:
        args: dict[str, Any] = {"recording_id": recording_id, "start": start}
        if end is not None:
            args["end"] = end
        return self._start_replay_request("replay", args, deadline)

    def _start_replay_request(self, op: str, args: dict[str, Any], deadline: float) -> int:
        while True:
            request_id = -1
            try:
                request_id = self._send_request(op, args)
                self._replay_queues[request_id] = deque()
                self._wait_reply(request_id, deadline)
                return request_id
            except SessionLostError as exc:
                self._replay_queues.pop(request_id, None)
                if not self._may_retry(op, deadline):
                    raise
                self._reconnect(deadline, exc)
            except BaseException:
                self._replay_queues.pop(request_id, None)
                raise

    def _resuming_replay(
        self, recording_id: int, start: int, end: int | None, request_id: int
    ) -> Iterator[ReplayBlock]:
        """The replay's blocks; on a lost session, a new one replays from the end of the last
        block delivered (positions are exact: no block twice, none skipped)."""
        position = start
        while True:
            blocks = self._replay_blocks(request_id, [(position, end)])
            try:
                for block in blocks:
                    position = block.end_position
                    yield block
                return
            except _ReplayOverrun:
                # its unread blocks were dropped while other calls ran: ask again from here
                request_id = self._start_replay(recording_id, position, end, self._deadline())
            except SessionLostError as exc:
                if self._closed:
                    raise
                if end is not None and position >= end:
                    return  # every block came; only the end marker was lost
                deadline = self._deadline()  # timeout_s from the loss
                log.info(
                    "%s: %s; resuming the replay of recording %d at %d",
                    self.settings.endpoint,
                    exc,
                    recording_id,
                    position,
                )
                self._reconnect(deadline, exc)
                request_id = self._start_replay(recording_id, position, end, deadline)
                self.counters.replay_resumes += 1
            finally:
                blocks.close()

    def _replay_blocks(
        self, request_id: int, spans: list[tuple[int, int | None]]
    ) -> Generator[ReplayBlock, None, None]:
        """The blocks of one replay of ``spans`` (``(start, end)`` each, in order: one for a
        ``replay``, several for a ``replay_ranges``), each block checked to start where the
        previous one ended, or where the next span starts once one is read to its end."""
        generation = self._generation
        at = 0
        expected = spans[0][0]
        end = spans[-1][1]
        finished = False
        try:
            queue = self._replay_queues.get(request_id)
            if queue is None:  # gone before its first read: overrun, or its session replaced
                finished = True  # stopped already, or with its session
                if request_id in self._overrun:
                    self._overrun.discard(request_id)
                    raise _ReplayOverrun(request_id)
                raise SessionLostError(
                    f"replay {request_id}: its session to {self.settings.endpoint} was replaced"
                )
            while True:
                if not queue:
                    deadline = None if end is None else self._deadline()
                    self._reading = request_id
                    while not queue:
                        if request_id in self._overrun:
                            self._overrun.discard(request_id)
                            finished = True  # stopped already
                            raise _ReplayOverrun(request_id)
                        if self._generation != generation:
                            raise SessionLostError(
                                f"replay {request_id}: its session to "
                                f"{self.settings.endpoint} was replaced"
                            )
                        if self._session_error is not None:
                            error, self._session_error = self._session_error, None
                            raise error
                        got = self._receive_one(
                            deadline
                            if deadline is not None
                            else time.monotonic() + self.settings.timeout_s
                        )
                        if not got and deadline is not None and time.monotonic() >= deadline:
                            raise ServerUnavailableError(
                                f"replay {request_id} stalled: no data from "
                                f"{self.settings.endpoint} within {self.settings.timeout_s} s"
                            )
                    self._reading = None
                item = queue.popleft()
                if isinstance(item, ReplayBlock):
                    self._replay_bytes[request_id] -= len(item.data)
                    while at + 1 < len(spans) and expected == spans[at][1]:
                        at += 1  # the span was read to its end: the next one's start
                        expected = spans[at][0]
                    if item.position != expected:
                        raise ControlProtocolError(
                            f"replay {request_id}: block at {item.position}, expected {expected}"
                        )
                    expected = item.end_position
                    yield item
                    continue
                finished = True
                if not item.ok:
                    raise error_from_wire(item.error)
                final = int(item.result["position"])
                while at + 1 < len(spans) and expected == spans[at][1]:
                    at += 1
                    expected = spans[at][0]
                if end is not None and (final != end or expected != end or at + 1 < len(spans)):
                    raise ControlProtocolError(
                        f"replay {request_id} ended at {final} (data to {expected}), asked {end}"
                    )
                return
        finally:
            if self._reading == request_id:
                self._reading = None
            self._replay_queues.pop(request_id, None)
            self._replay_bytes.pop(request_id, None)
            self._overrun.discard(request_id)
            if (
                not finished
                and not self._closed
                and self._generation == generation
                and self._link.is_connected
            ):
                self._send_stop_replay(request_id)

    def _pipelined(
        self,
        op: str,
        base: dict[str, Any],
        payloads: Iterable[bytes] | Iterable[PayloadRun],
        reserved_values: Iterable[int] | None,
        final_flag: bool,
    ) -> Any:
        pending: deque[int] = deque()
        result: Any = None
        # stay under one transport message (no chunking) unless a single payload is larger;
        # 16 bytes a payload for its msgpack bin header and list slot, generously; and within the
        # payloads one request may carry
        batches = batched(
            payloads,
            reserved_values,
            self.settings.max_request_bytes,
            _PAYLOAD_OVERHEAD,
            proto.MAX_PAYLOADS_PER_REQUEST,
        )
        current: tuple[list[bytes] | PayloadRun, list[int] | None] | None = next(batches)
        try:
            while current is not None:
                following = next(batches, None)
                batch, rvs = current
                if isinstance(batch, PayloadRun):  # a request carries bytes
                    run = batch
                    batch, rvs = run.payloads(), run.reserved_list()
                args = dict(base, payloads=batch)
                if rvs is not None:
                    args["reserved_values"] = rvs
                if final_flag:
                    args["final"] = following is None
                if batch or following is None:
                    pending.append(self._send_request(op, args))
                    self._in_operation = True  # no silent reconnect halfway through
                while len(pending) >= self.settings.max_in_flight:
                    result = self._wait_reply(pending.popleft())
                current = following
            while pending:
                result = self._wait_reply(pending.popleft())
            return result
        except BaseException:
            self._settle(pending)
            raise
        finally:
            self._in_operation = False

    def _settle(self, pending: deque[int]) -> None:
        """After a failed pipelined operation: collect the replies still due (so the session is
        clean for the next call), or forget them if the session is gone."""
        for request_id in pending:
            try:
                if self._link.is_connected:
                    self._wait_reply(request_id)
            except ConnectorError:
                pass
            self._outstanding.discard(request_id)
            self._replies.pop(request_id, None)

    def message_limit(self, stream_id: int) -> int:
        """The largest message ``stream_id`` takes on this session's server: Aeron's
        ``min(term_length / 8, 16 MiB)`` of the stream's term length (the server's
        ``--term-length`` / ``--stream-term-length``), asked once per session and stream
        (``limits``, control protocol version 2). A server of version 1 does not say: then
        Aeron's 16 MiB, which no server exceeds."""
        limit = self._limits.get(stream_id)
        if limit is None:
            try:
                args = {"stream_ids": [int(stream_id)]}
                if self._in_operation:  # asked halfway through a stage: a lost session is
                    # the operation's to handle (stage() stages again), never replaced here
                    result = self._wait_reply(self._send_request("limits", args))
                else:
                    result = self.call("limits", **args)
                limit = int(dict((int(s), int(n)) for s, n in result["streams"])[stream_id])
            except ControlProtocolError:  # "unknown operation": a version 1 server
                limit = proto.MAX_PAYLOAD_BYTES
            except (KeyError, TypeError, ValueError) as exc:
                raise ControlProtocolError(f"malformed limits reply: {exc}") from exc
            self._limits[stream_id] = limit
        return limit

    def _check_length(
        self, stream_id: int, index: int, length: int, sent: bool, op: str = "publish"
    ) -> None:
        """Refuse a message longer than the stream takes (coded ``PAYLOAD_TOO_LARGE``, naming
        its size and the limit), before it is sent; counted in ``messages_refused``."""
        if length <= _ALWAYS_FITS:
            return
        limit = self.message_limit(stream_id)
        if length <= limit:
            return
        self.counters.messages_refused += 1
        raise PayloadTooLargeError(
            f"PAYLOAD_TOO_LARGE: message {index} of the {op} to stream {stream_id} is "
            f"{length} bytes; the stream takes at most {limit} (Aeron's min(term_length / 8, "
            "16 MiB) of the server's --term-length / --stream-term-length); "
            + (
                f"the messages before it may have been sent ({op})"
                if sent
                else f"nothing of this {op} was sent"
            ),
            length=length,
            limit=limit,
            stream_id=stream_id,
            index=index,
        )

    def _checked(
        self,
        stream_id: int,
        payloads: Iterable[bytes] | Iterable[PayloadRun],
        op: str = "publish",
    ) -> Iterable[Any]:
        """``payloads`` with every message checked against the stream's limit before it is
        sent: a list or tuple all at once (nothing is sent when one is too long), any other
        iterable as it is consumed."""
        if isinstance(payloads, (list, tuple)):
            for index, item in enumerate(payloads):
                self._check_length(stream_id, index, _longest(item), False, op)
            return payloads
        return self._checking(stream_id, payloads, op)

    def _checking(self, stream_id: int, payloads: Iterable[Any], op: str) -> Iterator[Any]:
        for index, item in enumerate(payloads):
            self._check_length(stream_id, index, _longest(item), index > 0, op)
            yield item

    def publish(
        self,
        stream_id: int,
        payloads: Iterable[bytes],
        reserved_values: Iterable[int] | None = None,
    ) -> int:
        """Publish messages into ``stream_id``; returns the recording's end position after them.
        All messages of one client go to one recording per stream (this session's).

        A message longer than the stream takes (:meth:`message_limit`) is refused before it is
        sent, with :class:`PayloadTooLargeError`; when ``payloads`` is a list or tuple, nothing
        of the publish is sent then. A large message is sent in chunks cut from it as they go:
        the client holds the payload and a chunk or two, never a second copy of it."""
        try:
            if reserved_values is None and self._fits_one_request(payloads):
                result = self._publish_one(stream_id, payloads)  # type: ignore[arg-type]
            else:
                result = self._pipelined(
                    "publish",
                    {"stream_id": stream_id},
                    self._checked(stream_id, payloads),
                    reserved_values,
                    False,
                )
        except SessionLostError as exc:
            # Not sent again: what was in flight may be recorded already (twice, if resent), and
            # a new session publishes into a recording of its own. The next call reconnects.
            raise ServerUnavailableError(
                f"the session to {self.settings.endpoint} was lost during a publish to stream "
                f"{stream_id} ({exc}); a publish is not sent again on a new session (what was in "
                "flight may be recorded already): look at the stream's recordings and publish "
                "what is missing"
            ) from exc
        return int(result) if result is not None else 0

    def _fits_one_request(self, payloads: Any) -> bool:
        """A list of 1 .. ``MAX_PAYLOADS_PER_REQUEST`` bytes, each of a length every stream
        takes, within ``max_request_bytes`` counted as :func:`batched` counts: the one request
        ``_pipelined`` would make of it (no length to check, nothing to cut)."""
        if type(payloads) is not list or not 0 < len(payloads) <= proto.MAX_PAYLOADS_PER_REQUEST:
            return False
        size = 0
        for payload in payloads:
            if type(payload) is not bytes or len(payload) > _ALWAYS_FITS:
                return False
            size += len(payload) + _PAYLOAD_OVERHEAD
        return size <= self.settings.max_request_bytes

    def _publish_one(self, stream_id: int, payloads: list[bytes]) -> Any:
        """A publish of one request (``_fits_one_request``), as ``_pipelined`` sends it,
        without its batching generator, length checks and parts: a dozen of the ~75 Python
        calls a client's publish of one small message made (issue 31)."""
        args = {"stream_id": stream_id, "payloads": payloads}
        request_id = self._send_request("publish", args, whole=True)
        self._in_operation = True  # no silent reconnect halfway through
        try:
            return self._wait_reply(request_id)
        except BaseException:
            if request_id in self._outstanding:  # not when its (error) reply was taken: none
                self._settle(deque((request_id,)))  # other comes, settling waited timeout_s
            raise
        finally:
            self._in_operation = False

    def stage(
        self,
        sink_id: str,
        batch_id: int,
        partition_id: int,
        attempt: int,
        stream_id: int,
        payloads: Iterable[bytes] | Iterable[PayloadRun],
        reserved_values: Iterable[int] | None = None,
        *,
        local: bool = True,
    ) -> dict:
        """Stage payloads for a later :meth:`commit`; returns the picklable commit message.

        With ``local`` and a server that allows it, a process that can write the server's
        directory writes the part file itself (see :mod:`~aeron_spark.connector.local`; the
        server checks every record); otherwise the payloads go over the session.

        A session lost on the way is replaced and the whole part staged again on the new one
        (the server recreates a part for the first write of a session to it, so nothing is
        doubled) from the payloads kept meanwhile, up to :data:`RESTAGE_BUFFER_BYTES`; past
        that, or ``timeout_s`` after the loss, :class:`ServerUnavailableError` is raised."""
        kept = _Kept(payloads, RESTAGE_BUFFER_BYTES)
        kept_rvs = None if reserved_values is None else _Kept(reserved_values, None)
        deadline: float | None = None
        while True:
            try:
                return self._stage_once(
                    sink_id, batch_id, partition_id, attempt, stream_id, kept, kept_rvs, local
                )
            except SessionLostError as exc:
                if self._closed:
                    raise
                if not kept.whole:
                    raise ServerUnavailableError(
                        f"the session to {self.settings.endpoint} was lost while staging part "
                        f"{partition_id}-{attempt} of sink {sink_id!r} batch {batch_id}, which "
                        f"is larger than the {RESTAGE_BUFFER_BYTES} bytes kept to stage it again "
                        f"({exc}); the task must be retried"
                    ) from exc
                deadline = deadline if deadline is not None else self._deadline()
                log.info(
                    "%s: %s; staging part %d-%d of batch %d again",
                    self.settings.endpoint,
                    exc,
                    partition_id,
                    attempt,
                    batch_id,
                )
                self._reconnect(deadline, exc)
                self.counters.restages += 1

    def _stage_once(
        self,
        sink_id: str,
        batch_id: int,
        partition_id: int,
        attempt: int,
        stream_id: int,
        payloads: Iterable[bytes] | Iterable[PayloadRun],
        reserved_values: Iterable[int] | None,
        local: bool,
    ) -> dict:
        base = {
            "sink_id": sink_id,
            "batch_id": batch_id,
            "partition_id": partition_id,
            "attempt": attempt,
            "stream_id": stream_id,
        }
        if local:
            fd = local_io.open_part(self.call("local_stage", **base))
            if fd is not None:
                batches = batched(payloads, reserved_values, local_io.WRITE_BATCH_BYTES)
                count, nbytes = local_io.write_part(fd, batches)
                self.counters.local_stages += 1
                return dict(self.call("local_stage_done", **base, count=count, bytes=nbytes))
        # over the session, a message past the stream's limit is refused before it is sent
        checked = self._checked(stream_id, payloads, "stage")
        return dict(self._pipelined("stage", base, checked, reserved_values, True))

    def commit(
        self, sink_id: str, batch_id: int, stream_id: int | None, staged: list[dict]
    ) -> dict:
        """Append the staged parts to the stream, once per ``(sink_id, batch_id)``; a repeated
        commit returns the first result and appends nothing. ``stream_id`` None: the parts'
        streams, several in one commit (a routing sink; a server of issue 32 or later)."""
        args: dict[str, Any] = {"sink_id": sink_id, "batch_id": batch_id}
        if stream_id is not None:
            args["stream_id"] = stream_id
        return dict(self.call("commit", **args, staged=[dict(s) for s in staged]))

    def abort(self, sink_id: str, batch_id: int, staged: list[dict]) -> None:
        self.call("abort", sink_id=sink_id, batch_id=batch_id, staged=[dict(s) for s in staged])

    def last_committed_batch(self, sink_id: str) -> int | None:
        result = self.call("last_committed_batch", sink_id=sink_id)
        return None if result is None else int(result)

    def purge(self, recording_id: int, up_to_position: int) -> int:
        """Discard the recording before ``up_to_position`` (rounded down to what the store can
        drop); returns the new first readable position."""
        return int(self.call("purge", recording_id=recording_id, position=up_to_position))

    def consumer_commit(
        self, consumer_id: str, stream_ids: Iterable[int], positions: dict[int, int]
    ) -> None:
        """Tell the server this consumer has processed each recording up to its position, so
        retention may purge below it (and, with the server's default, not above it)."""
        self.call(
            "consumer_commit",
            consumer_id=consumer_id,
            stream_ids=sorted(set(stream_ids)),
            positions=[[int(r), int(p)] for r, p in sorted(positions.items())],
        )

    def consumer_forget(self, consumer_id: str) -> bool:
        """Stop holding data for a consumer that will not come back."""
        return bool(self.call("consumer_forget", consumer_id=consumer_id))

    def stats(self) -> dict[str, Any]:
        return dict(self.call("stats"))


def _per_range(
    count: int, tagged: Iterator[tuple[int, ReplayBlock]]
) -> Iterator[Iterator[ReplayBlock]]:
    """``count`` iterators, the blocks of ``tagged`` (``(index, block)``, indexes ascending)
    for each index in turn; the blocks of an iterator left unread are skipped by the next."""
    held: list[tuple[int, ReplayBlock]] = []

    def one(index: int) -> Iterator[ReplayBlock]:
        while True:
            if not held:
                got = next(tagged, None)
                if got is None:
                    return
                held.append(got)
            at, block = held[0]
            if at > index:
                return
            held.clear()
            if at == index:
                yield block

    try:
        for index in range(count):
            yield one(index)
        for _ in tagged:  # the end of the replay (its end event), with nothing left unread
            pass
    finally:
        close = getattr(tagged, "close", None)
        if close is not None:
            close()


def batched(
    payloads: Iterable[bytes | PayloadRun],
    reserved_values: Iterable[int] | None,
    limit: int,
    overhead: int = 0,
    max_count: int = 0,
) -> Iterator[tuple[list[bytes] | PayloadRun, list[int] | None]]:
    """Payloads (as bytes) with their reserved values (one taken after each payload), in
    batches of at most ``limit`` bytes counting ``overhead`` per payload (a larger payload alone)
    and at most ``max_count`` payloads (0: any); always at least one batch (an empty one when
    there is no payload).

    A :class:`~aeron_spark.connector.runs.PayloadRun` among the payloads is cut into pieces
    within the limit (slices: no copy, no Python object per payload) yielded as batches of their
    own, each with ``None`` (a run carries its reserved values)."""
    batch: list[bytes] = []
    rvs: list[int] | None = None if reserved_values is None else []
    size = 0
    rv_iter = None if reserved_values is None else iter(reserved_values)
    yielded = False
    for payload in payloads:
        if isinstance(payload, PayloadRun):  # its own reserved values; cut, never copied
            if rv_iter is not None:
                raise ConfigurationError(
                    "reserved_values", "given beside a payload run", "the run's own reserved values"
                )
            if batch:
                yield batch, rvs
                batch, size = [], 0
            for piece in payload.split(limit, overhead, max_count):
                yield piece, None
                yielded = True
            continue
        if not isinstance(payload, bytes):
            payload = bytes(payload)
        cost = len(payload) + overhead
        if batch and (size + cost > limit or len(batch) == max_count):
            yield batch, rvs
            yielded = True
            batch, size = [], 0
            rvs = None if reserved_values is None else []
        batch.append(payload)
        size += cost
        if rv_iter is not None and rvs is not None:
            try:
                rvs.append(int(next(rv_iter)))
            except StopIteration:
                raise ConfigurationError(
                    "reserved_values", "shorter than payloads", "one reserved value per payload"
                ) from None
    if batch or not yielded:
        yield batch, rvs


def _longest(item: bytes | PayloadRun) -> int:
    """A payload's length, or the longest of a run's."""
    if isinstance(item, PayloadRun):
        offsets = item.offsets()
        return int((offsets[1:] - offsets[:-1]).max()) if len(offsets) > 1 else 0
    return len(item)


class _Kept:
    """An iterable that keeps what it yields (up to ``limit`` payload bytes; None: no limit), so
    a second iteration yields the same items again, then goes on with the source. ``whole``:
    nothing was dropped, so the items can be iterated from the start again."""

    def __init__(self, source: Iterable[Any], limit: int | None) -> None:
        self._source = iter(source)
        self._items: list[Any] = []
        self._bytes = 0
        self._limit = limit
        self.whole = True

    def __iter__(self) -> Iterator[Any]:
        if not self.whole:
            raise ConfigurationError("payloads", "iterated again", "one pass (too large to keep)")
        yield from list(self._items)
        for item in self._source:
            if self.whole:
                if self._limit is not None:
                    self._bytes += item.nbytes if isinstance(item, PayloadRun) else len(item)
                if self._limit is not None and self._bytes > self._limit:
                    self.whole = False
                    self._items.clear()
                else:
                    self._items.append(item)
            yield item


_POOL_IDLE_S = 20.0  # well inside the server's session lease (60 s by default)
_pool_lock = threading.Lock()
_pool: dict[ClientSettings, list[tuple[float, StreamClient]]] = {}


@contextlib.contextmanager
def pooled(settings: ClientSettings) -> Iterator[StreamClient]:
    """A session for ``settings`` from this process's pool (a new one if none is idle), given back
    after a clean exit so the next task or micro-batch skips the handshake. A session with
    anything in flight, or used in a block that raised, is closed instead of pooled."""
    client = None
    now = time.monotonic()
    with _pool_lock:
        idle = _pool.get(settings, [])
        while idle:
            since, candidate = idle.pop()
            if now - since < _POOL_IDLE_S and not candidate._closed:
                client = candidate
                break
            candidate.close()
    if client is None:
        client = StreamClient.connect(settings)
    try:
        yield client
    except BaseException:
        client.close()
        raise
    if client._closed or client._replay_queues or client._outstanding or client._in_operation:
        client.close()
        return
    with _pool_lock:
        _pool.setdefault(settings, []).append((time.monotonic(), client))


__all__ = [
    "ClientSettings",
    "RecordingInfo",
    "ReplayBlock",
    "ScanResult",
    "StreamClient",
    "pooled",
]

"""What the stream server's core holds and the shapes it talks in: the store and replay
protocols it drives, a session, an executed request's outcome, and :class:`CoreState` (the
attributes every part of :class:`~connector.server.core.ServerCore` shares, and the few methods
one part calls in another)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aeron_spark.connector.errors import (
    ConnectorError,
)
from aeron_spark.connector.server.authz import Authorizer
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.retention import ConsumerRegistry, Retention
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.session import protocol as proto
from aeron_spark.connector.session.chunking import Reassembler, ReassemblyBudget
from aeron_spark.counters import CounterMap


class ReplayCursor(Protocol):
    @property
    def position(self) -> int: ...

    def read(self, max_bytes: int, now_ns: int) -> tuple[int, int, int, bytes | memoryview] | None:
        """``(position, end_position, timestamp_ns, frames)`` or None when nothing is ready."""

    @property
    def done(self) -> bool: ...
    def close(self) -> None: ...


class Publisher(Protocol):
    recording_id: int

    def publish(
        self, payloads: Sequence[bytes], reserved_values: Sequence[int] | None, now_ns: int
    ) -> int: ...
    def close(self, now_ns: int) -> None: ...


class Store(Protocol):
    local_token: dict[str, str] | None  # {token_path, token}: proves a client sees the directory

    def list_recordings(self, stream_ids: set[int] | None) -> list[dict[str, Any]]: ...
    def streams(self) -> list[dict[str, Any]]: ...
    def recording_info(self, recording_id: int) -> dict[str, Any]: ...
    def stream_of(self, recording_id: int) -> int: ...
    def positions(self, stream_ids: set[int] | None) -> list[list[Any]]: ...
    def position_at(self, recording_id: int, timestamp_ns: int) -> int: ...
    def open_replay(self, recording_id: int, start: int, end: int | None) -> ReplayCursor: ...
    def local_read(self, recording_id: int, start: int, end: int) -> dict[str, Any] | None: ...
    def open_publisher(self, stream_id: int, source: str, now_ns: int) -> Publisher: ...
    def expect_publishers(self, count: int) -> None: ...
    def purge(self, recording_id: int, position: int, now_ns: int) -> int: ...
    def recording_gone(self, recording_id: int) -> bool: ...
    def check_space(self, what: str) -> None: ...
    def resource_error(self, exc: OSError, what: str) -> ConnectorError | None: ...
    def stats(self) -> dict[str, Any]: ...


@dataclass
class Replay:
    request_id: int
    cursor: ReplayCursor
    max_block_bytes: int
    stream_ids: tuple[int, ...] = ()  # what it reads (several: ``replay_ranges``)
    revoked: ConnectorError | None = None  # its key may no longer read the stream: end it


@dataclass
class Session:
    key: object
    peer: str
    max_message_length: int
    lease_deadline_ns: int
    opened_ns: int
    reassembler: Reassembler
    replays: dict[int, Replay] = field(default_factory=dict)
    publishers: dict[int, Publisher] = field(default_factory=dict)
    requests: int = 0
    errors: int = 0
    bytes_replayed: int = 0
    identity: bytes = b""  # the client's static public key (proven in the handshake)
    deferred_in_flight: int = 0  # requests handed to the shell's worker, not yet answered
    share: str = ""  # its client (key hex, else address): whose per-client shares it counts in


@dataclass(frozen=True, slots=True)
class Outcome:
    """What executing a request gave (``result``, or the ``error`` it raised): the effect a
    deferred operation's job returns to the I/O loop, which feeds it to
    :meth:`ServerCore.complete` for the reply."""

    key: object
    session: Session
    request: proto.Request
    result: Any = None
    error: Exception | None = None
    deferred: bool = False  # it held one of its session's deferred places (run on the worker)


@dataclass(frozen=True, slots=True)
class KeysReloaded:
    """What re-reading the authorized keys file gave (the shell runs that I/O, then feeds this
    to :meth:`ServerCore.keys_reloaded`): the keys no longer listed, or the error that left the
    previous table in force."""

    removed: frozenset[bytes] = frozenset()
    error: Exception | None = None


# the items of a long request (ranges) between two calls of CoreState.step_hook
STEP_ITEMS = 256


def stepping(items: Sequence[Any], hook: Callable[[], None] | None) -> Iterable[Any]:
    """``items`` of a long request, ``hook`` (the shell's driver stepped when due) called
    before every ``STEP_ITEMS``-th after the first; ``items`` itself without a hook."""
    return items if hook is None else _stepped(items, hook)


def _stepped(items: Sequence[Any], hook: Callable[[], None]) -> Iterator[Any]:
    for i, item in enumerate(items):
        if i and not i % STEP_ITEMS:
            hook()
        yield item


class CoreState:
    """The core's state (set by ``ServerCore.__init__``) and the methods its parts share."""

    config: ServerConfig
    store: Store
    committer: SinkCommitter
    sessions: dict[object, Session]
    counters: CounterMap
    reassembly: ReassemblyBudget
    # per client (Session.share): its share of ``reassembly`` and the sessions it has open
    _incomplete_shares: dict[str, list[Any]]
    consumers: ConsumerRegistry
    retention: Retention
    stats_hook: Callable[[int | None], dict[str, Any]] | None
    # when a session's transport last heard its client (None: not alive): see expire()
    transport_heard_ns: Callable[[object], int | None] | None
    defer: Callable[[object, Callable[[], Outcome]], None] | None
    authz: Authorizer | None
    # the shell's: called between the items of a long request, every STEP_ITEMS (ServerCore)
    step_hook: Callable[[], None] | None
    _replay_owner: dict[int, object]
    _leases: list[tuple[int, int, object]]  # (lease deadline, n, session key): a heap
    _reassembling: set[object]  # sessions that may hold an incomplete chunked message
    _unpublished: int  # open sessions with no publisher yet (spare recordings kept for them)
    _lease_ids: Iterator[int]

    def _expect_publishers(self, delta: int) -> None:
        raise NotImplementedError  # ServerCore's

    def _authorise(self, op: str, stream_ids: Iterable[int] = ()) -> None:
        raise NotImplementedError  # ServerCore's (the dispatch table's policy)

    def _dispatch(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        raise NotImplementedError  # ServerCore's

    def _stream_of(self, recording_id: int) -> int:
        raise NotImplementedError  # requests.py

    def _count_error(self, exc: ConnectorError) -> None:
        raise NotImplementedError  # requests.py


__all__ = [
    "STEP_ITEMS",
    "CoreState",
    "KeysReloaded",
    "Outcome",
    "Publisher",
    "Replay",
    "ReplayCursor",
    "Session",
    "Store",
    "stepping",
]

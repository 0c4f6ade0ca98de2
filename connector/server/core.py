"""The stream server's request handling, without sockets or threads (sans-I/O).

The I/O shell (``server.py``) feeds it whole session messages and the time; it returns the
messages to send back. Replays are pumped separately (:meth:`ServerCore.pump`) so the shell can
stop pumping a session whose connection is back-pressured.

Invariants:

- Every request gets exactly one reply with its id (``ok`` or a typed error); a malformed message
  is answered with a :class:`ControlProtocolError` on its id (0 when it has none) and counted; no
  request of one session can disturb another session (errors are per request, state per session).
- A replay belongs to the session that asked for it and ends with one ``replay_end`` event
  (``ok`` with the end position, or an error such as :class:`PurgedError`).
- A session that sends nothing and consumes nothing (no message to it goes out) for
  ``session_lease_ns`` is expired: its replays stop, its
  publications' recordings stop, its unfinished staged parts are left to the lease GC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aeron_spark.connector.errors import (
    ConnectorError,
    ControlProtocolError,
    LimitExceededError,
    NotAuthorisedError,
    PayloadTooLargeError,
    ServerError,
    StorageFullError,
    TooManyOpenFilesError,
    from_archive,
)
from aeron_spark.connector.server.authz import Authorizer
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.counters import core_counters, server_counters
from aeron_spark.connector.server.retention import ConsumerRegistry, Retention, RetentionPolicy
from aeron_spark.connector.server.scan import scan
from aeron_spark.connector.server.staging import PartKey, SinkCommitter
from aeron_spark.connector.session import protocol as proto
from aeron_spark.connector.session.chunking import Reassembler, ReassemblyBudget
from aeron_spark.transport.archive import ArchiveError
from aeron_spark.transport.protocol.logbuffer import max_message_length

log = logging.getLogger(__name__)


class ReplayCursor(Protocol):
    position: int

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
    def recording_info(self, recording_id: int) -> dict[str, Any]: ...
    def position_at(self, recording_id: int, timestamp_ns: int) -> int: ...
    def open_replay(self, recording_id: int, start: int, end: int | None) -> ReplayCursor: ...
    def local_read(self, recording_id: int, start: int, end: int) -> dict[str, Any] | None: ...
    def open_publisher(self, stream_id: int, source: str, now_ns: int) -> Publisher: ...
    def purge(self, recording_id: int, position: int, now_ns: int) -> int: ...
    def check_space(self, what: str) -> None: ...
    def resource_error(self, exc: OSError, what: str) -> ConnectorError | None: ...
    def stats(self) -> dict[str, Any]: ...


@dataclass
class _Replay:
    request_id: int
    cursor: ReplayCursor
    max_block_bytes: int
    stream_id: int = 0
    revoked: ConnectorError | None = None  # its key may no longer read the stream: end it


@dataclass
class Session:
    key: object
    peer: str
    max_message_length: int
    lease_deadline_ns: int
    opened_ns: int
    reassembler: Reassembler
    replays: dict[int, _Replay] = field(default_factory=dict)
    publishers: dict[int, Publisher] = field(default_factory=dict)
    requests: int = 0
    errors: int = 0
    bytes_replayed: int = 0
    identity: bytes = b""  # the client's static public key (proven in the handshake)


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


@dataclass(frozen=True, slots=True)
class KeysReloaded:
    """What re-reading the authorized keys file gave (the shell runs that I/O, then feeds this
    to :meth:`ServerCore.keys_reloaded`): the keys no longer listed, or the error that left the
    previous table in force."""

    removed: frozenset[bytes] = frozenset()
    error: Exception | None = None


# Long-running operations the I/O shell may run off its loop (``ServerCore.defer``), so a large
# sink commit does not stall every replay. They only touch the committer and sink recordings.
DEFERRED_OPS = frozenset({"commit", "abort", "scan", "consumer_commit"})


class ServerCore:
    def __init__(self, config: ServerConfig, store: Store, committer: SinkCommitter) -> None:
        self.config = config
        self.store = store
        self.committer = committer
        self.sessions: dict[object, Session] = {}
        self.counters = core_counters()
        # what every session's incomplete chunked messages may hold together (issue 28, item 2)
        self.reassembly = ReassemblyBudget(config.max_incomplete_bytes)
        self._replay_owner: dict[int, object] = {}
        self.consumers = ConsumerRegistry(config.directory)
        self.retention = Retention(
            RetentionPolicy(
                config.retention_bytes,
                config.retention_s,
                config.retention_respects_consumers,
                config.consumer_lease_s,
            ),
            self.consumers,
            may_read=self._owner_may_read,
        )
        # set by the I/O shell: extra sections of ``stats`` (server identity, transport counters)
        self.stats_hook: Callable[[], dict[str, Any]] | None = None
        # set by the I/O shell: run ``job`` (returns the reply) elsewhere, reply on ``key`` later
        self.defer: Callable[[object, Callable[[], Outcome]], None] | None = None
        # set by the I/O shell with --authorized-keys: per-client permissions (authz.py)
        self.authz: Authorizer | None = None

    # --- sessions -----------------------------------------------------------------------------

    def open_session(
        self,
        key: object,
        peer: str,
        max_message_length: int,
        now_ns: int,
        identity: bytes = b"",
    ) -> Session | None:
        """Open a session for an established link; None (counted as revoked) when the client's
        key was removed from the authorized keys while its handshake was in flight."""
        if self.authz is not None and not self.authz.knows(identity):
            self.counters.add("sessions_revoked")
            return None
        session = Session(
            key,
            peer,
            max_message_length,
            now_ns + self.config.session_lease_ns,
            now_ns,
            Reassembler(
                self.config.max_incomplete_bytes_per_session,
                int(self.config.incomplete_message_timeout_s * 1e9),
                self.reassembly,
            ),
            identity=identity,
        )
        self.sessions[key] = session
        self.counters["sessions_opened"] += 1
        return session

    def close_session(self, key: object, now_ns: int) -> None:
        session = self.sessions.pop(key, None)
        if session is None:
            return
        session.reassembler.close()  # what its incomplete message held goes back to the budget
        for replay in session.replays.values():
            replay.cursor.close()
            self._replay_owner.pop(replay.request_id, None)
        for publisher in session.publishers.values():
            try:
                publisher.close(now_ns)
            except Exception:  # noqa: BLE001 - closing one session must not stop the server
                self.counters["internal_errors"] += 1
                log.exception("closing a publication of %s failed", session.peer)
        self.committer.staging.release_owner(key)
        self.counters["sessions_closed"] += 1

    def renew_lease(self, key: object, now_ns: int) -> None:
        """The session made progress without a request (it consumed what was sent to it)."""
        session = self.sessions.get(key)
        if session is not None:
            session.lease_deadline_ns = now_ns + self.config.session_lease_ns

    def expire(self, now_ns: int) -> list[object]:
        """Close sessions whose lease ran out; returns their keys (the shell closes connections).
        Discards incomplete messages whose next chunk is overdue, on the clock (counted)."""
        if self.reassembly.open:  # only while some session has a message open
            for session in self.sessions.values():
                if session.reassembler.expire(now_ns):
                    self.counters.add("incomplete_messages_expired")
        expired = [k for k, s in self.sessions.items() if now_ns >= s.lease_deadline_ns]
        for key in expired:
            self.close_session(key, now_ns)
            self.counters["sessions_expired"] += 1
        return expired

    def keys_reloaded(self, reload: KeysReloaded, now_ns: int) -> list[object]:
        """Count a reload of the authorized keys file (or its failure) and close the sessions
        of the keys it removed; returns their keys (the shell closes the connections)."""
        if reload.error is not None:
            self.counters.add("authorized_keys_reload_failures")
            return []
        self.counters.add("authorized_keys_reloads")
        revoked = [k for k, s in self.sessions.items() if s.identity in reload.removed]
        for key in revoked:
            self.close_session(key, now_ns)
        self.counters.add("sessions_revoked", len(revoked))
        self._recheck_replays()
        return revoked

    def _recheck_replays(self) -> None:
        """After a reload: end every replay whose key may no longer read its stream (the next
        :meth:`pump` sends its ``replay_end`` with the error, and reads nothing more)."""
        authz = self.authz
        if authz is None:
            return
        for session in self.sessions.values():
            for replay in session.replays.values():
                if replay.revoked is None and not authz.may(
                    session.identity, "replay", replay.stream_id
                ):
                    replay.revoked = NotAuthorisedError(
                        f"NOT_AUTHORISED: replay {replay.request_id} ended: client "
                        f"{authz.name_of(session.identity)!r} may no longer read its stream",
                        op="replay",
                        client=authz.name_of(session.identity),
                    )

    def _identity(self, session: Session) -> str | None:
        """The owner a session's sink batches, sink ids and consumers get: its client key
        (hex) when the server authorises clients; None (no ownership) on an open server."""
        return session.identity.hex() if self.authz is not None else None

    def _owner_may_read(self, owner: str, stream_id: int) -> bool:
        """Retention: does a consumer's owner (hex; "" recorded without one) still read the
        stream? Always on an open server; a consumer with no owner counts everywhere."""
        authz = self.authz
        if authz is None or not owner:
            return True
        try:
            key = bytes.fromhex(owner)
        except ValueError:  # not one of ours (a hand-edited file): it holds, as before owners
            return True
        return authz.may(key, "consumer_commit", stream_id)

    def next_deadline_ns(self) -> int | None:
        deadlines = [s.lease_deadline_ns for s in self.sessions.values()]
        return min(deadlines) if deadlines else None

    # --- requests -----------------------------------------------------------------------------

    def on_message(
        self, key: object, message: bytes | bytearray | memoryview, now_ns: int, wall_ns: int
    ) -> list[bytes]:
        """Handle one message received on a session; returns the replies to send on it.
        ``now_ns`` is the monotonic clock (leases, replays), ``wall_ns`` the wall clock (what is
        stored or shown as a date: consumer commits, ages): both come from the caller."""
        session = self.sessions.get(key)
        if session is None:
            return []
        session.lease_deadline_ns = now_ns + self.config.session_lease_ns
        if len(message) and message[0] == proto.KIND_CHUNK:
            try:
                whole = session.reassembler.feed(message, now_ns)
            except LimitExceededError as exc:  # the incomplete-message budget: refused
                self.counters.add("incomplete_messages_refused")
                self.counters["chunks_discarded"] += 1
                return [proto.encode_error(0, exc)]
            except ConnectorError as exc:
                self.counters["protocol_errors"] += 1
                self.counters["chunks_discarded"] += 1
                if isinstance(exc, PayloadTooLargeError):  # announced past the session's bound
                    self.counters.add("incomplete_messages_refused")
                return [proto.encode_error(0, exc)]
            if whole is None:
                return []
            message = whole
            del whole
        self.counters["requests"] += 1
        session.requests += 1
        try:
            request = proto.decode_request(message)
            # the request holds what it needs: a reassembled message goes now, not after the
            # handler ran (a large publish held it beside its payload and its frames)
            del message
        except ControlProtocolError as exc:
            self.counters["protocol_errors"] += 1
            session.errors += 1
            return [proto.encode_error(int(exc.details.pop("request_id", 0)), exc)]
        if request.op in DEFERRED_OPS and self.defer is not None:
            self.defer(key, lambda: self._run(key, session, request, now_ns, wall_ns))
            return []
        return [self.complete(self._run(key, session, request, now_ns, wall_ns))]

    def _run(
        self, key: object, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Outcome:
        """Execute one decoded request. For a deferred operation this runs on the I/O shell's
        worker: it touches only the store, the committer and the consumers (never the core's
        counters or sessions), and hands back an :class:`Outcome` for :meth:`complete`."""
        try:
            try:
                authz = self.authz
                if authz is None:
                    result = self._dispatch(session, request, now_ns, wall_ns)
                else:  # the one permission check of every request (op -> permission: authz.py)
                    try:
                        authz.check(session.identity, request.op, request.args, self._stream_of)
                    except NotAuthorisedError:
                        self.counters["requests_not_authorised"] += 1
                        raise
                    result = authz.visible(
                        session.identity,
                        request.op,
                        self._dispatch(session, request, now_ns, wall_ns),
                        self._stream_of,
                    )
            except ArchiveError as exc:  # the archive's errors travel as the wire's own
                raise from_archive(exc) from exc
            except OSError as exc:  # a full disk or no descriptor left: that request fails
                coded = self.store.resource_error(exc, request.op)
                if coded is None:
                    raise
                raise coded from exc
        except Exception as exc:  # noqa: BLE001 - reported typed by complete()
            return Outcome(key, session, request, error=exc)
        return Outcome(key, session, request, result=result)

    def complete(self, outcome: Outcome) -> bytes:
        """The reply to an executed request (ok or the typed error), counted. Runs on the loop's
        thread only, so the core's counters and sessions have one writer. Never raises."""
        session, request, exc = outcome.session, outcome.request, outcome.error
        if exc is None:
            return proto.encode_ok(request.id, outcome.result)
        session.errors += 1
        if isinstance(exc, ConnectorError):
            self.counters["request_errors"] += 1
            self._count_error(exc)
            if exc.details.get("reason") == "not_owner":
                self.counters["requests_not_owner"] += 1
            return proto.encode_error(request.id, exc)
        # a bug or I/O failure: report it typed, count it, keep serving
        self.counters["internal_errors"] += 1
        log.error("internal error in %s from %s", request.op, session.peer, exc_info=exc)
        return proto.encode_error(
            request.id,
            ServerError(f"{request.op} failed on the server: {type(exc).__name__}: {exc}"),
        )

    def _count_error(self, exc: ConnectorError) -> None:
        if isinstance(exc, NotAuthorisedError):
            self.counters["not_authorised"] += 1
        elif isinstance(exc, StorageFullError):
            self.counters["storage_full_errors"] += 1
        elif isinstance(exc, TooManyOpenFilesError):
            self.counters["too_many_open_files_errors"] += 1

    def _authorise(self, op: str, stream_ids: Iterable[int] = ()) -> None:
        if op in WRITE_OPS and self.config.read_only:
            raise NotAuthorisedError(f"{op} refused: the server is read-only", op=op)
        if op == "purge" and not self.config.allow_purge:
            raise NotAuthorisedError("purge refused: the server does not allow purging", op=op)
        allowed = self.config.allowed_stream_ids
        if allowed is not None:
            for stream_id in stream_ids:
                if stream_id not in allowed:
                    raise NotAuthorisedError(
                        f"stream {stream_id} is not served to sessions", op=op, stream_id=stream_id
                    )

    def _stream_of(self, recording_id: int) -> int:
        return int(self.store.recording_info(recording_id)["stream_id"])

    def _dispatch(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        try:
            handler, _permission = HANDLERS[request.op]
        except KeyError:  # pragma: no cover - decode_request admits only the schemas' ops
            raise ControlProtocolError(f"operation {request.op} is not served") from None
        self._authorise(request.op)  # operation-level policy first, before any lookup
        return handler(self, session, request, now_ns, wall_ns)

    # --- the operations (one handler each; see HANDLERS) --------------------------------------

    def _op_keepalive(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return None

    def _op_list_streams(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self._list_streams()

    def _wanted_recordings(self, op: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        ids = args.get("stream_ids")
        wanted = set(ids) if ids is not None else None
        self._authorise(op, wanted or ())
        return self._visible_recordings(wanted)

    def _op_list_recordings(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self._wanted_recordings("list_recordings", request.args)

    def _op_latest_positions(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        recordings = self._wanted_recordings("latest_positions", request.args)
        return [[r["recording_id"], r["recorded_position"]] for r in recordings]

    def _op_position_at(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        self._authorise("position_at", [self._stream_of(args["recording_id"])])
        return self.store.position_at(args["recording_id"], args["timestamp_ns"])

    def _op_scan(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        args = request.args
        self._authorise("scan", [self._stream_of(args["recording_id"])])
        if args.get("parts", 1) > 4096:
            raise ControlProtocolError("scan: parts must be at most 4096")
        cursor = self.store.open_replay(args["recording_id"], args["start"], args.get("end"))
        return scan(
            cursor,
            args["start"],
            max_messages=args.get("max_messages"),
            max_bytes=args.get("max_bytes"),
            parts=max(int(args.get("parts", 1)), 1),
            now_ns=now_ns,
        )

    def _op_replay(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self._start_replay(session, request, now_ns)

    def _op_stop_replay(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self._stop_replay(session, request.args["replay_id"])

    def _op_local_read(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        self._authorise("replay", [self._stream_of(args["recording_id"])])
        where = self.store.local_read(args["recording_id"], args["start"], args["end"])
        self.counters["local_reads_offered" if where else "local_reads_refused"] += 1
        return where

    def _op_publish(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        self._authorise("publish", [args["stream_id"]])
        return self._publish(session, args, now_ns)

    def _op_stage(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        args = request.args
        self._authorise("stage", [args["stream_id"]])
        self.store.check_space("stage")
        identity = self._identity(session)
        self.committer.check_sink_owner(args["sink_id"], identity, "stage")
        return self.committer.staging.write(
            session.key,
            PartKey.of(args),
            args["stream_id"],
            args["payloads"],
            args.get("reserved_values"),
            args["final"],
            identity=identity,
        )

    def _op_local_stage(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        self._authorise("local_stage", [args["stream_id"]])
        token = self.store.local_token
        if not self.config.local_writes or token is None:
            self.counters["local_stages_refused"] += 1
            return None
        identity = self._identity(session)
        self.committer.check_sink_owner(args["sink_id"], identity, "local_stage")
        self.store.check_space("local_stage")
        path = self.committer.staging.open_local(
            session.key, PartKey.of(args), args["stream_id"], identity
        )
        self.counters["local_stages_offered"] += 1
        return {"path": path, **token}

    def _op_local_stage_done(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        self._authorise("local_stage_done", [args["stream_id"]])
        return self.committer.staging.finish_local(
            session.key, PartKey.of(args), args["stream_id"], args["count"], args["bytes"]
        )

    def _op_commit(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        stream_id = args.get("stream_id")
        # every stream the commit appends to (each part's stream was write-checked when staged,
        # and is again now: a key narrowed since then commits nothing)
        streams = {int(item["stream_id"]) for item in args["staged"]}
        if stream_id is not None:
            streams.add(stream_id)
        self._authorise("commit", sorted(streams))
        self.store.check_space("commit")
        return self.committer.commit(
            args["sink_id"],
            args["batch_id"],
            stream_id,
            args["staged"],
            now_ns,
            owner=self._identity(session),
        )

    def _op_abort(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        args = request.args
        self._authorise("abort")
        self.committer.abort(
            args["sink_id"], args["batch_id"], args["staged"], owner=self._identity(session)
        )
        return None

    def _op_consumer_commit(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        ids = [int(s) for s in args.get("stream_ids", [])]
        self._authorise("consumer_commit", ids)
        positions = dict(args["positions"])
        authz, identity = self.authz, session.identity
        self.consumers.commit(
            args["consumer_id"],
            ids,
            positions,
            wall_ns / 1e9,
            owner=self._identity(session),
            # a consumer recorded without an owner: claimed by a client that reads its streams
            may_claim=lambda streams: (
                authz is None or all(authz.may(identity, "consumer_commit", s) for s in streams)
            ),
        )
        return None

    def _op_consumer_forget(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        authz, identity = self.authz, session.identity
        return self.consumers.forget(
            request.args["consumer_id"],
            owner=self._identity(session),
            # another client's consumer: only with admin on every stream it holds
            may_override=lambda streams: (
                authz is None or all(authz.may(identity, "consumer_forget", s) for s in streams)
            ),
        )

    def _op_last_committed_batch(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self.committer.last_committed_batch(request.args["sink_id"], self._identity(session))

    def _op_purge(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        args = request.args
        self._authorise("purge", [self._stream_of(args["recording_id"])])
        return self.store.purge(args["recording_id"], args["position"], now_ns)

    def _op_stats(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        return self.stats(now_ns, wall_ns)

    def _op_limits(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        """The largest message each asked stream takes (control protocol version 2): its
        recordings' Aeron limit, and no more than one session's incomplete-message bound lets
        a publish request carry (a request's own bytes are under 1 KiB beside its payload)."""
        config = self.config
        carried = config.max_incomplete_bytes_per_session - 1024
        streams = request.args.get("stream_ids") or []
        return {
            "version": proto.CONTROL_PROTOCOL_VERSION,
            "max_message_length": min(max_message_length(config.term_length), carried),
            "streams": [
                [s, min(config.max_message_length_for(s), carried)] for s in sorted(set(streams))
            ],
        }

    def _visible_recordings(self, stream_ids: set[int] | None) -> list[dict[str, Any]]:
        allowed = self.config.allowed_stream_ids
        return [
            r
            for r in self.store.list_recordings(stream_ids)
            if allowed is None or r["stream_id"] in allowed
        ]

    def _list_streams(self) -> list[dict[str, Any]]:
        streams: dict[int, dict[str, Any]] = {}
        for rec in self._visible_recordings(None):
            entry = streams.setdefault(
                rec["stream_id"],
                {
                    "stream_id": rec["stream_id"],
                    "recordings": 0,
                    "active_recordings": 0,
                    "bytes": 0,
                },
            )
            entry["recordings"] += 1
            entry["active_recordings"] += rec["stop_position"] is None
            entry["bytes"] += rec["recorded_position"] - rec["purged_position"]
        return [streams[k] for k in sorted(streams)]

    def _publish(self, session: Session, args: dict[str, Any], now_ns: int) -> int:
        payloads, rvs = args["payloads"], args.get("reserved_values")
        if rvs is not None and len(rvs) != len(payloads):
            raise ControlProtocolError("publish: reserved_values and payloads differ in length")
        stream_id = args["stream_id"]
        publisher = session.publishers.get(stream_id)
        if publisher is None:
            publisher = self.store.open_publisher(stream_id, f"session:{session.peer}", now_ns)
            session.publishers[stream_id] = publisher
        end = publisher.publish(payloads, rvs, now_ns)
        self.counters["messages_published"] += len(payloads)
        self.counters["bytes_published"] += sum(map(len, payloads))
        return end

    # --- replays ------------------------------------------------------------------------------

    def _start_replay(self, session: Session, request: proto.Request, now_ns: int) -> Any:
        args = request.args
        if len(session.replays) >= self.config.max_replays_per_session:
            raise LimitExceededError(
                f"a session may run at most {self.config.max_replays_per_session} replays at once",
                limit=self.config.max_replays_per_session,
            )
        if request.id in session.replays:
            raise ControlProtocolError(f"request id {request.id} is already a running replay")
        stream_id = self._stream_of(args["recording_id"])
        self._authorise("replay", [stream_id])
        cursor = self.store.open_replay(args["recording_id"], args["start"], args.get("end"))
        limit = min(
            args.get("max_block_bytes") or self.config.max_block_bytes,
            self.config.max_block_bytes,
            session.max_message_length - proto.REPLAY_DATA_HEADER_LENGTH,
        )
        session.replays[request.id] = _Replay(request.id, cursor, max(limit, 4096), stream_id)
        self._replay_owner[request.id] = session.key
        self.counters["replays_started"] += 1
        return {"replay_id": request.id, "start": args["start"], "end": args.get("end")}

    def _stop_replay(self, session: Session, replay_id: int) -> bool:
        replay = session.replays.pop(replay_id, None)
        if replay is None:
            return False
        replay.cursor.close()
        self.counters["replays_stopped"] += 1
        return True

    def has_replays(self, key: object) -> bool:
        session = self.sessions.get(key)
        return session is not None and bool(session.replays)

    def pump(self, key: object, budget_bytes: int, now_ns: int) -> list[bytes]:
        """Up to ``budget_bytes`` of replay data for one session (plus end events)."""
        session = self.sessions.get(key)
        if session is None or not session.replays:
            return []
        out: list[bytes] = []
        sent = 0
        for rid in list(session.replays):
            replay = session.replays[rid]
            if replay.revoked is not None:  # its key may no longer read the stream (reload)
                out.append(proto.encode_event_error(rid, "replay_end", replay.revoked))
                replay.cursor.close()
                del session.replays[rid]
                self.counters["replays_revoked"] += 1
                continue
            try:
                while sent < budget_bytes:
                    chunk = replay.cursor.read(
                        min(replay.max_block_bytes, budget_bytes - sent + 4096), now_ns
                    )
                    if chunk is None:
                        break
                    position, end_position, ts, frames = chunk
                    out.append(proto.encode_replay_header(rid, position, end_position, ts) + frames)
                    sent += len(frames) + proto.REPLAY_DATA_HEADER_LENGTH
                    session.bytes_replayed += len(frames)
                    self.counters["replay_bytes"] += len(frames)
                    self.counters["replay_blocks"] += 1
                if replay.cursor.done:
                    out.append(
                        proto.encode_event(rid, "replay_end", {"position": replay.cursor.position})
                    )
                    replay.cursor.close()
                    del session.replays[rid]
                    self.counters["replays_completed"] += 1
            except Exception as exc:
                error = self._replay_error(exc, rid, session)
                out.append(proto.encode_event_error(rid, "replay_end", error))
                replay.cursor.close()
                del session.replays[rid]
                self.counters["replays_failed"] += 1
            if sent >= budget_bytes:
                break
        return out

    def _replay_error(self, exc: Exception, rid: int, session: Session) -> ConnectorError:
        """The typed ``replay_end`` error of a replay that failed."""
        if isinstance(exc, ConnectorError):
            return exc
        if isinstance(exc, ArchiveError):
            return from_archive(exc)
        if isinstance(exc, OSError):
            coded = self.store.resource_error(exc, "replay")
            if coded is not None:
                self._count_error(coded)
                return coded
        log.exception("replay %s of %s failed", rid, session.peer)
        self.counters["internal_errors"] += 1
        return ServerError(f"replay failed on the server: {type(exc).__name__}: {exc}")

    # --- housekeeping -------------------------------------------------------------------------

    def stats(self, now_ns: int, wall_ns: int) -> dict[str, Any]:
        """Everything ``aeron-spark stat`` shows at monotonic ``now_ns`` and wall ``wall_ns``."""
        sessions = [
            {
                "peer": s.peer,
                "age_s": (now_ns - s.opened_ns) / 1e9,
                "requests": s.requests,
                "errors": s.errors,
                "replays": len(s.replays),
                "bytes_replayed": s.bytes_replayed,
                "publishing": sorted(s.publishers),
                **({"client": self.authz.name_of(s.identity)} if self.authz else {}),
            }
            for s in self.sessions.values()
        ]
        committer = self.committer
        counters = server_counters(
            self.counters,
            self.retention.counters,
            {
                "consumer_commits": self.consumers.commits,
                "sink_commits": committer.commits,
                "sink_duplicate_commits": committer.duplicate_commits,
                "sink_resumed_commits": committer.resumed_commits,
                "sink_aborts": committer.aborts,
                "sink_parts_staged": committer.staging.parts_staged,
                "sink_parts_staged_locally": committer.staging.parts_staged_locally,
                "sink_parts_garbage_collected": committer.staging.parts_garbage_collected,
                "sink_failed_commits": committer.failed_commits,
                "sink_stage_failures": committer.staging.stage_failures,
            },
        )
        result = {
            "streams": self._list_streams(),
            "recordings": self._visible_recordings(None),
            "sessions": sessions,
            "counters": counters,
            "store": self.store.stats(),
            "consumers": self.consumers.describe(wall_ns / 1e9),
        }
        if self.stats_hook is not None:
            result.update(self.stats_hook())
        return result


Handler = Callable[[ServerCore, Session, proto.Request, int, int], Any]

# The dispatch table: every operation of the protocol's schemas, its handler and its access (the
# permission it needs, whether a read-only server serves it: ``proto.PERMISSIONS``). Checked at
# import: an operation with a schema and no handler (or the reverse) cannot be served by mistake.
HANDLERS: dict[str, tuple[Handler, proto.Access]] = {
    op: (getattr(ServerCore, f"_op_{op}"), access) for op, access in proto.PERMISSIONS.items()
}
if (
    set(HANDLERS) != set(proto.OPS)
    or any(  # pragma: no cover - fails every test at import
        name.startswith("_op_") and name[4:] not in HANDLERS for name in vars(ServerCore)
    )
):
    raise AssertionError("ServerCore's handlers and the protocol's operations differ")

# Refused by a read-only server: what its access says a read-only server does not serve.
WRITE_OPS = frozenset(op for op, (_, access) in HANDLERS.items() if not access.read_only_serves)

__all__ = [
    "HANDLERS",
    "WRITE_OPS",
    "KeysReloaded",
    "Outcome",
    "Publisher",
    "ReplayCursor",
    "ServerCore",
    "Session",
    "Store",
]

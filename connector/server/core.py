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
  ``session_lease_ns``, and whose transport (``transport_heard_ns``: the shell's) showed no
  sign of its client for as long, is expired: its replays stop, its
  publications' recordings stop, its unfinished staged parts are left to the lease GC.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aeron_spark.connector.errors import (
    ControlProtocolError,
    NotAuthorisedError,
)
from aeron_spark.connector.server.authz import Authorizer
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.counters import core_counters, server_counters
from aeron_spark.connector.server.ranges import scan_ranges
from aeron_spark.connector.server.replays import ReplaysMixin
from aeron_spark.connector.server.requests import RequestsMixin
from aeron_spark.connector.server.retention import ConsumerRegistry, Retention, RetentionPolicy
from aeron_spark.connector.server.scan import scan
from aeron_spark.connector.server.sessions import SessionsMixin
from aeron_spark.connector.server.staging import PartKey, SinkCommitter
from aeron_spark.connector.server.state import (
    KeysReloaded,
    Outcome,
    Publisher,
    ReplayCursor,
    Session,
    Store,
    stepping,
)
from aeron_spark.connector.session import protocol as proto
from aeron_spark.connector.session.chunking import ReassemblyBudget
from aeron_spark.transport.protocol.logbuffer import max_message_length

log = logging.getLogger(__name__)


class ServerCore(SessionsMixin, RequestsMixin, ReplaysMixin):
    """The operations (one ``_op_`` handler each: the dispatch table below) over its parts: the
    sessions (``sessions.py``), the request path (``requests.py``), the replays (``replays.py``);
    the state they share and the protocols of the store they drive: ``state.py``."""

    def __init__(self, config: ServerConfig, store: Store, committer: SinkCommitter) -> None:
        self.config = config
        self.store = store
        self.committer = committer
        self.sessions: dict[object, Session] = {}
        self.counters = core_counters()
        # what every session's incomplete chunked messages may hold together (issue 28, item 2)
        self.reassembly = ReassemblyBudget(config.max_incomplete_bytes)
        self._incomplete_shares: dict[str, list[Any]] = {}
        self._replay_owner: dict[int, object] = {}
        self._leases: list[tuple[int, int, object]] = []
        self._lease_ids = itertools.count()
        self._reassembling: set[object] = set()
        # open sessions that have not published: as many empty recording directories are kept
        # ready (store.expect_publishers), so a first publish renames one (issue 31 item 1)
        self._unpublished = 0
        self.consumers = ConsumerRegistry(
            config.directory, config.max_consumer_positions, config.consumer_positions_share
        )
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
        # set by the I/O shell: extra sections of ``stats`` (server identity, transport counters),
        # given ``stats``'s ``listed``
        self.stats_hook: Callable[[int | None], dict[str, Any]] | None = None
        # set by the I/O shell: when a session's transport last heard its client's driver
        # (monotonic ns; None: silent or gone), asked when its lease runs out (expire)
        self.transport_heard_ns: Callable[[object], int | None] | None = None
        # set by the I/O shell: run ``job`` (returns the reply) elsewhere, reply on ``key`` later
        self.defer: Callable[[object, Callable[[], Outcome]], None] | None = None
        # set by the I/O shell with --authorized-keys: per-client permissions (authz.py)
        self.authz: Authorizer | None = None
        # set by the I/O shell (its driver stepped by its loop): called between the items of a
        # long request, every STEP_ITEMS of them (a request of 65,536 ranges took 0.3-0.6 s of
        # the loop on a quiet machine, and no status message went to any client meanwhile)
        self.step_hook: Callable[[], None] | None = None

    # --- policy and dispatch ---------------------------------------------------------------

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

    def _dispatch(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        try:
            handler, _permission = HANDLERS[request.op]
        except KeyError:  # pragma: no cover - decode_request admits only the schemas' ops
            raise ControlProtocolError(f"operation {request.op} is not served") from None
        # operation-level policy first, before any lookup; an operation on one stream named by
        # its ``stream_id`` has that stream checked in the same call (once a publish)
        op = request.op
        self._authorise(op, (request.args["stream_id"],) if op in ONE_STREAM_OPS else ())
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

    def _op_recording_positions(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        ids = request.args.get("stream_ids")
        wanted = set(ids) if ids is not None else None
        self._authorise("recording_positions", wanted or ())
        allowed = self.config.allowed_stream_ids
        return [row for row in self.store.positions(wanted) if allowed is None or row[1] in allowed]

    def _op_scan_ranges(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        args = request.args
        ranges = args["ranges"]
        self._authorise("scan_ranges", sorted({self._stream_of(r[0]) for r in ranges}))
        return scan_ranges(
            self.store, ranges, args.get("max_messages"), args.get("max_bytes"), now_ns
        )

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

    def _op_local_read_ranges(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        """Where a client that sees this directory reads each range (one request for a packed
        input partition's ranges, each checked as ``local_read`` checks one): the recordings'
        directories in the order asked, and the token; None when local reads are off."""
        ranges = request.args["ranges"]
        self._authorise("replay", sorted({self._stream_of(r[0]) for r in ranges}))
        local_read, items = self.store.local_read, stepping(ranges, self.step_hook)
        found = [local_read(rid, start, end) for rid, start, end in items]
        if not found or found[0] is None:
            self.counters["local_reads_refused"] += len(found)
            return None
        self.counters["local_reads_offered"] += len(found)
        first = found[0]
        return {
            "directories": [w["directory"] for w in found if w is not None],
            "token_path": first["token_path"],
            "token": first["token"],
        }

    def _op_replay_ranges(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self._start_replay_ranges(session, request, now_ns)

    def _op_publish(
        self, session: Session, request: proto.Request, now_ns: int, wall_ns: int
    ) -> Any:
        return self._publish(session, request.args, now_ns)

    def _op_stage(self, session: Session, request: proto.Request, now_ns: int, wall_ns: int) -> Any:
        args = request.args
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
        if authz is None:  # with authorized keys authz.py checks each recording (and its stream)
            for rid in positions:
                if isinstance(rid, int):  # other keys: refused as malformed by the registry
                    self._stream_of(rid)  # UNKNOWN_RECORDING naming it if it does not exist
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
            max_per_owner=self.config.max_consumers_per_client,
            client=session.share,
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
        purged = self.store.purge(args["recording_id"], args["position"], now_ns)
        if self.store.recording_gone(args["recording_id"]):  # finished and purged to its end
            try:
                self.consumers.drop_recordings(self.store.recording_gone)
            except OSError as exc:  # kept: dropped by a later retention run or start
                log.warning("cannot drop consumer positions of recordings gone: %s", exc)
        return purged

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
        """Per stream: recordings, active ones, bytes; the catalog's totals, kept by deltas
        (the live recordings re-read, not every one: issue 31 item 4), narrowed to the streams
        the server serves."""
        return self.store.streams()

    def _publish(self, session: Session, args: dict[str, Any], now_ns: int) -> int:
        payloads, rvs = args["payloads"], args.get("reserved_values")
        if rvs is not None and len(rvs) != len(payloads):
            raise ControlProtocolError("publish: reserved_values and payloads differ in length")
        stream_id = args["stream_id"]
        publisher = session.publishers.get(stream_id)
        if publisher is None:
            first = not session.publishers
            if first:  # one spare fewer wanted before it is taken: the spares' thread is not
                # woken to make one that would be wanted no more (issue 31: each wake-up of
                # another thread is GIL the loop waits for, 2,048 of them in one second)
                self._expect_publishers(-1)
            try:
                publisher = self.store.open_publisher(stream_id, f"session:{session.peer}", now_ns)
            except BaseException:
                if first:
                    self._expect_publishers(1)
                raise
            session.publishers[stream_id] = publisher
        end = publisher.publish(payloads, rvs, now_ns)
        self.counters.add_all(
            {"messages_published": len(payloads), "bytes_published": sum(map(len, payloads))}
        )
        return end

    def _expect_publishers(self, delta: int) -> None:
        """One session more (or less) that may still publish a first time (not on a read-only
        server): the store keeps that many spare recording directories ready."""
        if self.config.read_only:
            return
        self._unpublished += delta
        self.store.expect_publishers(self._unpublished)

    # --- housekeeping -------------------------------------------------------------------------

    def drop_gone_positions(self) -> None:
        """At start: drop the consumers' positions of recordings deleted while the server was
        down. The I/O shell calls it once the ids those positions name are issued past (the
        store never issues them again: a deleted recording's id taken by a new one would bring
        a Spark checkpoint's offsets of the old one to it)."""
        try:
            self.consumers.drop_recordings(self.store.recording_gone)
        except OSError as exc:  # a full disk: kept, dropped by a later retention run or start
            log.warning("cannot drop consumer positions of recordings gone: %s", exc)

    def stats(
        self, now_ns: int, wall_ns: int, catalog: bool = True, listed: int | None = None
    ) -> dict[str, Any]:
        """Everything ``aeron-spark stat`` shows at monotonic ``now_ns`` and wall ``wall_ns``;
        without the ``streams`` and ``recordings`` sections when not ``catalog`` (the shell's
        snapshot writer keeps those itself, re-encoding only what changed). ``listed``: at most
        that many sessions are listed (the first opened; ``sessions_total`` says how many
        there are), and the stats hook is told (the ``stat.json`` snapshot: issue 31 item 1)."""
        held = self.sessions.values()
        total = len(self.sessions)
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
            for s in (held if listed is None or total <= listed else itertools.islice(held, listed))
        ]
        committer = self.committer
        counters = server_counters(
            self.counters,
            self.retention.counters,
            {
                "consumer_commits": self.consumers.commits,
                "consumer_positions_dropped": self.consumers.positions_dropped,
                "consumer_commits_refused": self.consumers.commits_refused,
                "consumer_commits_over_share": self.consumers.commits_over_share,
                "new_consumers_refused": self.consumers.new_consumers_refused,
                "sink_commits": committer.commits,
                "sink_duplicate_commits": committer.duplicate_commits,
                "sink_resumed_commits": committer.resumed_commits,
                "sink_tail_bytes_cut": committer.tail_bytes_cut,
                "sink_aborts": committer.aborts,
                "sink_parts_staged": committer.staging.parts_staged,
                "sink_parts_staged_locally": committer.staging.parts_staged_locally,
                "sink_parts_garbage_collected": committer.staging.parts_garbage_collected,
                "sink_failed_commits": committer.failed_commits,
                "sink_stage_failures": committer.staging.stage_failures,
                "sink_forgotten_commits": committer.forgotten_commits,
                "sink_commit_log_compactions": committer.log.compactions,
                "sink_commit_log_compaction_failures": committer.log.compaction_failures,
            },
        )
        result: dict[str, Any] = {}
        if catalog:
            result["streams"] = self._list_streams()
            result["recordings"] = self._visible_recordings(None)
        if len(sessions) < total:
            result["sessions_total"] = total
        result |= {
            "sessions": sessions,
            "counters": counters,
            "store": self.store.stats(),
            "consumers": self.consumers.describe(wall_ns / 1e9),
        }
        if self.stats_hook is not None:
            result.update(self.stats_hook(listed))
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

# Operations on the one stream their required ``stream_id`` argument names: ``_dispatch``
# authorises that stream with the operation (their handlers do not again).
ONE_STREAM_OPS = frozenset({"publish", "stage", "local_stage", "local_stage_done"})
if any(  # pragma: no cover - fails every test at import
    proto.OPS[op].get("stream_id") != ("int32", True) for op in ONE_STREAM_OPS
):
    raise AssertionError("an operation of ONE_STREAM_OPS has no required stream_id")

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

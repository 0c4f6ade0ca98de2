"""The core's request path: a session's message decoded, run (on the loop or deferred to the
shell's worker), answered and counted."""

from __future__ import annotations

import logging

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
from aeron_spark.connector.server.authz import UnreadableRecordingError
from aeron_spark.connector.server.state import CoreState, Outcome, Session
from aeron_spark.connector.session import protocol as proto
from aeron_spark.transport.archive import ArchiveError

log = logging.getLogger(__name__)


# Long-running operations the I/O shell may run off its loop (``ServerCore.defer``), so a large
# sink commit does not stall every replay. They only touch the committer and sink recordings.
# ``recording_positions`` may scan what was ingested since it last looked.
# consumer_forget too: it rewrites and fsyncs the whole consumers' file as a commit does (on the
# loop, a client's forgets stalled every session: test_attack_forget_on_loop.py)
DEFERRED_OPS = frozenset(
    {
        "commit",
        "abort",
        "scan",
        "scan_ranges",
        "recording_positions",
        "consumer_commit",
        "consumer_forget",
    }
)
# A session's deferred requests queued or running at once: one more is refused at once
# (LIMIT_EXCEEDED, ``deferred_requests_refused``), so a client pipelining scans holds neither
# memory nor the one worker's queue (every session's commits wait behind what is queued: 150
# pipelined scans of a reader held a writer's commit for 15.8 s, test_attack_deferred_queue.py).
MAX_DEFERRED_PER_SESSION = 4


class RequestsMixin(CoreState):
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
                refused_by = session.reassembler.refused_by
                if refused_by is not None and refused_by.parent is not None:  # a client's share
                    self.counters.add("incomplete_messages_over_share")
                self.counters["chunks_discarded"] += 1
                return [proto.encode_error(0, exc)]
            except ConnectorError as exc:
                self.counters["protocol_errors"] += 1
                self.counters["chunks_discarded"] += 1
                if isinstance(exc, PayloadTooLargeError):  # announced past the session's bound
                    self.counters.add("incomplete_messages_refused")
                return [proto.encode_error(0, exc)]
            if whole is None:
                self._reassembling.add(key)  # its next chunk has a deadline (expire)
                return []
            message = whole
            del whole
        self.counters["requests"] += 1
        session.requests += 1
        deferring = self.defer is not None
        if deferring and session.deferred_in_flight >= MAX_DEFERRED_PER_SESSION:
            head = proto.request_head(message)  # its op suffices: the args are never decoded
            if head is not None and head[1] in DEFERRED_OPS:
                return [self._refuse_deferred(session, *head)]
        try:
            request = proto.decode_request(message)
            # the request holds what it needs: a reassembled message goes now, not after the
            # handler ran (a large publish held it beside its payload and its frames)
            del message
        except ControlProtocolError as exc:
            self.counters["protocol_errors"] += 1
            session.errors += 1
            return [proto.encode_error(int(exc.details.pop("request_id", 0)), exc)]
        if request.op in DEFERRED_OPS and deferring:
            assert self.defer is not None
            if session.deferred_in_flight >= MAX_DEFERRED_PER_SESSION:  # pragma: no cover
                return [self._refuse_deferred(session, request.id, request.op)]
            # its permission is checked here, on the loop, before it takes a place in the
            # session's queue: a refused request holds none (the worker only runs allowed ones)
            refused = self._check(key, session, request)
            if refused is not None:
                return [self.complete(refused)]
            session.deferred_in_flight += 1
            self.defer(key, lambda: self._run(key, session, request, now_ns, wall_ns, True))
            return []
        return [self.complete(self._run(key, session, request, now_ns, wall_ns))]

    def _refuse_deferred(self, session: Session, request_id: int, op: str) -> bytes:
        self.counters.add("deferred_requests_refused")
        self.counters["request_errors"] += 1
        session.errors += 1
        refused = LimitExceededError(
            f"{op}: a session may have at most {MAX_DEFERRED_PER_SESSION} "
            "commit, abort, scan, scan_ranges, recording_positions, consumer_commit and "
            "consumer_forget requests unanswered at once; wait for a reply before sending "
            "another",
            limit=MAX_DEFERRED_PER_SESSION,
            op=op,
        )
        return proto.encode_error(request_id, refused)

    def _check(self, key: object, session: Session, request: proto.Request) -> Outcome | None:
        """The one permission check of every request (op -> permission: authz.py); None when
        allowed (or no authorized keys), else the refusal's :class:`Outcome` (counted)."""
        authz = self.authz
        if authz is None:
            return None
        try:
            try:
                authz.check(session.identity, request.op, request.args, self._stream_of)
            except ArchiveError as exc:  # an unknown recording: the wire's own error
                raise from_archive(exc) from exc
        except (NotAuthorisedError, UnreadableRecordingError) as exc:
            self.counters["requests_not_authorised"] += 1
            return Outcome(key, session, request, error=exc)
        except Exception as exc:  # noqa: BLE001 - reported typed by complete()
            return Outcome(key, session, request, error=exc)
        return None

    def _run(
        self,
        key: object,
        session: Session,
        request: proto.Request,
        now_ns: int,
        wall_ns: int,
        checked: bool = False,
    ) -> Outcome:
        """Execute one decoded request (``checked``: its permission was checked when it was
        queued). For a deferred operation this runs on the I/O shell's worker: it touches only
        the store, the committer and the consumers (never the core's counters or sessions), and
        hands back an :class:`Outcome` for :meth:`complete`."""
        if not checked:
            refused = self._check(key, session, request)
            if refused is not None:
                return refused
        try:
            try:
                if checked and self.authz is not None:  # again: the keys may have been reloaded
                    self.authz.check(session.identity, request.op, request.args, self._stream_of)
                result = self._dispatch(session, request, now_ns, wall_ns)
                if self.authz is not None:  # listings narrowed to what the client may see
                    result = self.authz.visible(
                        session.identity, request.op, result, self._stream_of
                    )
            except ArchiveError as exc:  # the archive's errors travel as the wire's own
                raise from_archive(exc) from exc
            except OSError as exc:  # a full disk or no descriptor left: that request fails
                coded = self.store.resource_error(exc, request.op)
                if coded is None:
                    raise
                raise coded from exc
        except Exception as exc:  # noqa: BLE001 - reported typed by complete()
            return Outcome(key, session, request, error=exc, deferred=checked)
        return Outcome(key, session, request, result=result, deferred=checked)

    def complete(self, outcome: Outcome) -> bytes:
        """The reply to an executed request (ok or the typed error), counted. Runs on the loop's
        thread only, so the core's counters and sessions have one writer. Never raises."""
        session, request, exc = outcome.session, outcome.request, outcome.error
        if outcome.deferred:
            session.deferred_in_flight -= 1  # its place is free (the reply goes out now)
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
        if isinstance(exc, (NotAuthorisedError, UnreadableRecordingError)):
            self.counters["not_authorised"] += 1
        elif isinstance(exc, StorageFullError):
            self.counters["storage_full_errors"] += 1
        elif isinstance(exc, TooManyOpenFilesError):
            self.counters["too_many_open_files_errors"] += 1

    def _stream_of(self, recording_id: int) -> int:
        return self.store.stream_of(recording_id)  # the catalog's index, no description built


__all__ = ["DEFERRED_OPS", "MAX_DEFERRED_PER_SESSION", "RequestsMixin"]

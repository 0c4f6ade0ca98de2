"""The core's replays: started, pumped within a budget while the connection takes them, ended
with one ``replay_end`` event."""

from __future__ import annotations

import logging
from typing import Any

from aeron_spark.connector.errors import (
    ConnectorError,
    ControlProtocolError,
    LimitExceededError,
    ServerError,
    from_archive,
)
from aeron_spark.connector.server.state import (
    CoreState,
    Replay,
    ReplayCursor,
    Session,
    stepping,
)
from aeron_spark.connector.session import protocol as proto
from aeron_spark.transport.archive import ArchiveError

log = logging.getLogger(__name__)


class ReplaysMixin(CoreState):
    # --- replays ------------------------------------------------------------------------------

    def _start_replay(self, session: Session, request: proto.Request, now_ns: int) -> Any:
        args = request.args
        self._may_start_replay(session, request)
        stream_id = self._stream_of(args["recording_id"])
        self._authorise("replay", [stream_id])
        cursor = self.store.open_replay(args["recording_id"], args["start"], args.get("end"))
        self._add_replay(session, request, cursor, (stream_id,))
        return {"replay_id": request.id, "start": args["start"], "end": args.get("end")}

    def _start_replay_ranges(self, session: Session, request: proto.Request, now_ns: int) -> Any:
        """One replay of several ranges, one after the other in the order asked (a packed input
        partition's: issue 31 item 2), every range checked before anything is sent."""
        args = request.args
        ranges = args["ranges"]
        self._may_start_replay(session, request)
        if not ranges:
            raise ControlProtocolError(
                "replay_ranges: ranges must not be empty", op="replay_ranges"
            )
        streams = tuple(sorted({self._stream_of(r[0]) for r in ranges}))
        self._authorise("replay", streams)
        cursors = []
        open_replay = self.store.open_replay
        try:
            for recording_id, start, end in stepping(ranges, self.step_hook):
                cursors.append(open_replay(recording_id, start, end))
        except BaseException:
            for cursor in cursors:
                cursor.close()
            raise
        self._add_replay(session, request, ChainedCursor(cursors), streams)
        return {"replay_id": request.id, "ranges": len(ranges)}

    def _may_start_replay(self, session: Session, request: proto.Request) -> None:
        if len(session.replays) >= self.config.max_replays_per_session:
            raise LimitExceededError(
                f"a session may run at most {self.config.max_replays_per_session} replays at once",
                limit=self.config.max_replays_per_session,
            )
        if request.id in session.replays:
            raise ControlProtocolError(f"request id {request.id} is already a running replay")

    def _add_replay(
        self,
        session: Session,
        request: proto.Request,
        cursor: ReplayCursor,
        stream_ids: tuple[int, ...],
    ) -> None:
        limit = min(
            request.args.get("max_block_bytes") or self.config.max_block_bytes,
            self.config.max_block_bytes,
            session.max_message_length - proto.REPLAY_DATA_HEADER_LENGTH,
        )
        session.replays[request.id] = Replay(request.id, cursor, max(limit, 4096), stream_ids)
        self._replay_owner[request.id] = session.key
        self.counters["replays_started"] += 1

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


class ChainedCursor:
    """The cursors of several bounded ranges read one after the other: blocks never span two
    ranges (each cursor's end bounds its reads), an empty range gives none, and the position at
    the end is the last range's end."""

    def __init__(self, cursors: list[ReplayCursor]) -> None:
        self._cursors = cursors
        self._at = 0

    @property
    def position(self) -> int:
        return self._cursors[min(self._at, len(self._cursors) - 1)].position

    def read(self, max_bytes: int, now_ns: int) -> tuple[int, int, int, bytes | memoryview] | None:
        while self._at < len(self._cursors):
            cursor = self._cursors[self._at]
            if not cursor.done or self._at == len(self._cursors) - 1:
                return cursor.read(max_bytes, now_ns)
            cursor.close()
            self._at += 1
        return None  # pragma: no cover - the last cursor is kept

    @property
    def done(self) -> bool:
        return self._at >= len(self._cursors) - 1 and self._cursors[-1].done

    def close(self) -> None:
        for cursor in self._cursors[self._at :]:
            cursor.close()


__all__ = ["ChainedCursor", "ReplaysMixin"]

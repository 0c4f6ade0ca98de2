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
from aeron_spark.connector.server.state import CoreState, Replay, Session
from aeron_spark.connector.session import protocol as proto
from aeron_spark.transport.archive import ArchiveError

log = logging.getLogger(__name__)


class ReplaysMixin(CoreState):
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
        session.replays[request.id] = Replay(request.id, cursor, max(limit, 4096), stream_id)
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


__all__ = ["ReplaysMixin"]

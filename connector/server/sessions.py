"""The core's sessions: open, close, leases and their expiry, the authorized keys' reload."""

from __future__ import annotations

import heapq
import logging

from aeron_spark.connector.errors import (
    NotAuthorisedError,
)
from aeron_spark.connector.server.state import CoreState, KeysReloaded, Session
from aeron_spark.connector.session.chunking import Reassembler, ReassemblyBudget
from aeron_spark.handshake.machine import address_share

log = logging.getLogger(__name__)


class SessionsMixin(CoreState):
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
        share = self._share_of(peer, identity)
        held = self._incomplete_shares.get(share)
        if held is None:  # the client's first session: its share of the incomplete budget
            budget = ReassemblyBudget(
                self.config.incomplete_bytes_share,
                self.reassembly,
                "--max-incomplete-bytes-per-client",
            )
            held = self._incomplete_shares[share] = [budget, 0]
        held[1] += 1
        session = Session(
            key,
            peer,
            max_message_length,
            now_ns + self.config.session_lease_ns,
            now_ns,
            Reassembler(
                self.config.max_incomplete_bytes_per_session,
                int(self.config.incomplete_message_timeout_s * 1e9),
                held[0],
            ),
            identity=identity,
            share=share,
        )
        self.sessions[key] = session
        heapq.heappush(self._leases, (session.lease_deadline_ns, next(self._lease_ids), key))
        self.counters["sessions_opened"] += 1
        self._expect_publishers(1)
        return session

    def close_session(self, key: object, now_ns: int) -> None:
        session = self.sessions.pop(key, None)
        if session is None:
            return
        session.reassembler.close()  # what its incomplete message held goes back to the budget
        held = self._incomplete_shares.get(session.share)
        if held is not None:
            held[1] -= 1
            if not held[1]:  # its client's last session: it holds nothing
                del self._incomplete_shares[session.share]
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
        if not session.publishers:
            self._expect_publishers(-1)

    def renew_lease(self, key: object, now_ns: int) -> None:
        """The session made progress without a request (it consumed what was sent to it)."""
        session = self.sessions.get(key)
        if session is not None:
            session.lease_deadline_ns = now_ns + self.config.session_lease_ns

    def expire(self, now_ns: int) -> list[object]:
        """Close sessions whose lease ran out; returns their keys (the shell closes connections).
        A lease that ran out is first renewed from ``transport_heard_ns`` (the shell's: when
        the session's transport last heard the client's driver; None: not alive, or not to be
        renewed that way) to that time plus the lease, if that is still ahead: a session
        expires when it made no request, consumed nothing sent to it, and its transport was
        silent, all for the lease. Discards incomplete messages whose next chunk is overdue, on
        the clock (counted)."""
        if self._reassembling:  # only the sessions that took a chunk without its message's last
            for key in list(self._reassembling):
                session = self.sessions.get(key)
                if session is None or not session.reassembler.is_open:
                    self._reassembling.discard(key)  # closed, completed or discarded since
                elif session.reassembler.expire(now_ns):
                    self._reassembling.discard(key)
                    self.counters.add("incomplete_messages_expired")
        expired = []
        leases = self._leases
        lease_ns = self.config.session_lease_ns
        heard_ns = self.transport_heard_ns
        # a heap of (deadline, n, key), one entry per session; a lease renewed since its entry
        # was pushed is pushed again at its new deadline: a pass looks only at what is due
        while leases and leases[0][0] <= now_ns:
            _deadline, _n, key = heapq.heappop(leases)
            held = self.sessions.get(key)
            if held is None:
                continue  # closed meanwhile
            if now_ns >= held.lease_deadline_ns:
                # ran out: its transport may still show the client alive (issue 31: an idle
                # client's driver sends status messages and heartbeats every second), asked
                # only now, when its lease pops, never for every session on every pass
                heard = heard_ns(key) if heard_ns is not None else None
                if heard is None or heard + lease_ns <= now_ns:
                    expired.append(key)
                    continue
                held.lease_deadline_ns = heard + lease_ns
                self.counters["session_leases_renewed_by_transport"] += 1
            heapq.heappush(leases, (held.lease_deadline_ns, next(self._lease_ids), key))
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
                if replay.revoked is None and not all(
                    authz.may(session.identity, "replay", s) for s in replay.stream_ids
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

    def _share_of(self, peer: str, identity: bytes) -> str:
        """Whose share of a server-wide budget a session (``Session.share``) counts against: its
        client key (hex) when the server authorises clients; else its address, an IPv6 one's
        /64 (a client may make a key per session there: as ``--max-per-address`` counts
        sessions)."""
        if self.authz is not None:
            return identity.hex()
        return address_share(peer.rsplit(":", 1)[0] if ":" in peer else peer)

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

    @property
    def reassembling(self) -> bool:
        """Whether a session holds an incomplete chunked message (its next chunk is due on the
        clock: :meth:`expire` must run often)."""
        return bool(self._reassembling)

    def next_deadline_ns(self) -> int | None:
        """The earliest lease that may run out (a renewed one is found later: never late)."""
        leases = self._leases
        while leases and leases[0][2] not in self.sessions:
            heapq.heappop(leases)
        return leases[0][0] if leases else None


__all__ = ["SessionsMixin"]

"""Where one publication sends (Aeron's ``aeron_udp_destination_tracker.c``), sans I/O: the
unicast endpoint, or the receivers learned from their SMs (dynamic multi-destination-cast),
and who may become one.

Invariants:

* A dynamic publication adds a destination only from an SM that :meth:`Destinations.may_add`
  allows: the host in ``allowed_hosts`` (None: any), fewer than ``max_destinations`` (0: no
  limit), and with ``session_sm_only`` an SM naming the publication's own session id. Others are
  counted in ``status_messages_refused``.
* A SETUP request refused only because its host is not allowed yet is held (the last
  ``REFUSED_ELICITS_MAX``, ``status_messages_deferred``) and answered once if its host is
  allowed within ``REFUSED_ELICIT_NS`` (a handshake client asks before its HELLO makes the
  server allow it); else it is counted as refused when it expires.
* A receiver id belongs to the destination it was first heard from while that one lives: an SM
  naming it from another address is refused (counted), as is one naming a new id from a
  destination with ``MAX_RECEIVER_IDS`` ids still heard from (a flood of ids stays bounded).
* A destination silent for the connection timeout, or whose host is no longer allowed, is
  dropped with its receivers. ``hosts`` is replaced whole on every change (read by any thread).
"""

from __future__ import annotations

import functools
from typing import Any

from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS
from aeron_spark.transport.protocol.tally import counter

# A SETUP request refused because its host was not allowed is answered if the host is allowed
# within this time (before its next elicit, ELICIT_INTERVAL_NS later, would be); at most this
# many such requests are remembered.
REFUSED_ELICIT_NS = 100_000_000
REFUSED_ELICITS_MAX = 64
# Receiver ids one destination (one address) may have at a time: an honest one has one per
# image of the publication; a new id beyond these is refused until one of them goes silent.
MAX_RECEIVER_IDS = 4

Address = Any  # a socket address tuple: (host, port) or (host, port, flow, scope)


@functools.lru_cache(maxsize=4096)  # per SM of a dynamic publication (is_allowed)
def host_of(address: Address) -> str:
    """The IP address of a socket address, IPv4-mapped IPv6 addresses as IPv4."""
    host = str(address[0])
    return host[7:] if host.startswith("::ffff:") and "." in host else host


class Destination:
    """One place data goes: the unicast endpoint, or a receiver learned from its SMs (MDC)."""

    __slots__ = ("address", "last_seen_ns", "receiver_ids", "needs_setup", "window")

    def __init__(self, address: Address, now_ns: int, window: int = 0) -> None:
        self.address = address
        self.last_seen_ns = now_ns
        self.receiver_ids: set[int] = set()
        self.needs_setup = True
        self.window = window  # the receiver window of its last SM: bounds its retransmits


class Destinations:
    """The destinations of one publication, its admission rules and held SETUP requests."""

    # what it counts, also added to its driver's running totals (tally.py: no walk)
    status_messages_refused: int = counter()
    status_messages_deferred: int = counter()

    def __init__(self, session_id: int, connection_timeout_ns: int = CONNECTION_TIMEOUT_NS) -> None:
        self.session_id = session_id
        self.connection_timeout_ns = connection_timeout_ns
        self.by_address: dict[Address, Destination] = {}
        self.hosts: frozenset[str] = frozenset()  # replaced whole: read anywhere
        # Who may become a destination of a dynamic publication (None: anyone who sends an SM;
        # replaced whole by other threads, read by the sender), how many at most (0: no limit),
        # and whether only an SM carrying this publication's own session id makes one (a
        # session-0 "send me SETUPs" SM from a stranger then gets nothing).
        self.allowed_hosts: frozenset[str] | None = None
        self.max_destinations = 0
        self.session_sm_only = False
        # source -> (session id, when): SETUP requests refused only for their host, oldest first
        self.refused_elicits: dict[Address, tuple[int, int]] = {}
        self.refused_seen_allowed: frozenset[str] | None = None  # allowed_hosts when last seen
        self.status_messages_refused = 0  # SMs from a source that is not (may not be) one
        self.status_messages_deferred = 0  # SETUP requests held until their host is allowed
        # expire() finds nothing before this time while the allowed hosts and the timeout are
        # those it last looked at (a destination's last SM only moves later): it is called on
        # every send, and walked every destination each time (issue 31)
        self.expire_check_ns = 0
        self._expire_seen: tuple[frozenset[str] | None, int] = (None, 0)

    def add(self, address: Address, now_ns: int, window: int = 0) -> Destination:
        dest = self.by_address[address] = Destination(address, now_ns, window)
        self._hosts_changed()
        return dest

    def may_add(self, source: Address, session_id: int) -> bool:
        """Whether an SM from ``source`` (for ``session_id``) may make it a destination."""
        if self.session_sm_only and session_id != self.session_id:
            return False
        if self.max_destinations and len(self.by_address) >= self.max_destinations:
            return False
        allowed = self.allowed_hosts
        return allowed is None or host_of(source) in allowed

    def refused_only_for_host(self, source: Address, session_id: int) -> bool:
        """Whether a refused SETUP request may be held: its host is the only reason."""
        allowed = self.allowed_hosts
        return (
            allowed is not None
            and host_of(source) not in allowed
            and not (self.session_sm_only and session_id != self.session_id)
        )

    def is_allowed(self, source: Address) -> bool:
        allowed = self.allowed_hosts
        return allowed is None or host_of(source) in allowed

    def hold_refused(self, source: Address, session_id: int, now_ns: int) -> None:
        """Hold a SETUP request refused for its host (a repeated one renews the one held)."""
        refused = self.refused_elicits
        if refused.pop(source, None) is None:
            self.status_messages_deferred += 1
        if len(refused) >= REFUSED_ELICITS_MAX:
            del refused[next(iter(refused))]
            self.status_messages_refused += 1
        refused[source] = (session_id, now_ns)
        self.refused_seen_allowed = self.allowed_hosts

    def hold_unclaimed(self, source: Address, session_id: int, at_ns: int) -> None:
        """A SETUP request that came before the publication existed: answered by the next step
        like one refused until its host was allowed (if it is allowed by then)."""
        self.refused_elicits[source] = (session_id, at_ns)
        self.refused_seen_allowed = None

    def refused_changed(self) -> bool:
        """Held requests, and the allowed hosts changed since they were last looked at."""
        return bool(self.refused_elicits) and self.allowed_hosts is not self.refused_seen_allowed

    def refused_due(self, now_ns: int) -> bool:
        """Whether :meth:`answer_refused` has work: the allowed hosts changed, or the oldest
        held request expired (held in arrival order, so the first is the oldest)."""
        refused = self.refused_elicits
        if not refused:
            return False
        if self.allowed_hosts is not self.refused_seen_allowed:
            return True
        return now_ns - next(iter(refused.values()))[1] > REFUSED_ELICIT_NS

    def next_refused_ns(self) -> int | None:
        """When the oldest held request expires (None: none held)."""
        if not self.refused_elicits:
            return None
        return next(iter(self.refused_elicits.values()))[1] + REFUSED_ELICIT_NS + 1

    def answer_refused(self, now_ns: int, window: int) -> bool:
        """Held SETUP requests of a now allowed host, recent enough, become destinations (each
        answered once); expired ones are counted as refused. True if a destination was added."""
        allowed = self.refused_seen_allowed = self.allowed_hosts
        added = False
        for source, (session_id, at) in list(self.refused_elicits.items()):
            if now_ns - at > REFUSED_ELICIT_NS:
                del self.refused_elicits[source]
                if allowed is not None and host_of(source) not in allowed:
                    self.status_messages_refused += 1  # its host was not allowed in time
            elif allowed is None or host_of(source) in allowed:
                del self.refused_elicits[source]
                if source in self.by_address:
                    continue
                if not self.may_add(source, session_id):
                    self.status_messages_refused += 1
                    continue
                self.add(source, now_ns, window)
                added = True
        return added

    def expire(self, now_ns: int, receivers: dict[int, int]) -> bool:
        """Drop destinations silent too long or no longer allowed, with their receivers."""
        allowed = self.allowed_hosts
        timeout = self.connection_timeout_ns
        seen = self._expire_seen
        if now_ns < self.expire_check_ns and seen[0] is allowed and seen[1] == timeout:
            return False
        stale = [
            a
            for a, d in self.by_address.items()
            if now_ns - d.last_seen_ns > timeout
            or (allowed is not None and host_of(a) not in allowed)
        ]
        for address in stale:
            dest = self.by_address.pop(address)
            for rid in dest.receiver_ids:
                receivers.pop(rid, None)
        if stale:
            self._hosts_changed()
        by_address = self.by_address
        # the soonest any destination, one added later too, can be silent too long
        oldest = min(d.last_seen_ns for d in by_address.values()) if by_address else now_ns
        self.expire_check_ns = min(oldest, now_ns) + timeout + 1
        self._expire_seen = (allowed, timeout)
        return bool(stale)

    def next_expiry_ns(self) -> int | None:
        """When the destination heard from least recently times out (None: none)."""
        if not self.by_address:
            return None
        oldest = min(d.last_seen_ns for d in self.by_address.values())
        return oldest + self.connection_timeout_ns + 1

    def drop(self, address: Address, receivers: dict[int, int]) -> bool:
        """Remove one destination and its receivers; True if it was one."""
        dest = self.by_address.pop(address, None)
        if dest is None:
            return False
        self._hosts_changed()
        for rid in dest.receiver_ids:
            receivers.pop(rid, None)
        return True

    def admits_receiver(
        self, dest: Destination, receiver_id: int, receivers: dict[int, int]
    ) -> bool:
        """Whether an SM from ``dest`` naming ``receiver_id`` may count: not if another
        destination has that id (the SM is forged), nor if ``dest`` already has
        ``MAX_RECEIVER_IDS`` ids the flow control (``receivers``) still hears. Scans only for
        an id ``dest`` does not have yet."""
        ids = dest.receiver_ids
        if receiver_id in ids:
            return True
        if len(ids) >= MAX_RECEIVER_IDS:
            ids.intersection_update(receivers)  # forget those gone silent (or ended)
            if len(ids) >= MAX_RECEIVER_IDS:
                return False
        return not any(
            receiver_id in d.receiver_ids for d in self.by_address.values() if d is not dest
        )

    def remove_receiver(self, dest: Destination, receiver_id: int) -> None:
        """A receiver of ``dest`` ended its stream: the destination goes with its last one."""
        dest.receiver_ids.discard(receiver_id)
        if not dest.receiver_ids:
            del self.by_address[dest.address]
            self._hosts_changed()

    def _hosts_changed(self) -> None:
        self.hosts = frozenset(host_of(a) for a in self.by_address)

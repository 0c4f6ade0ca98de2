"""Sans-I/O state of one network publication: the client's log buffer and the sender's view of it.

The same object serves both sides of Aeron's split, as they share one process here:

* the **client** appends with :meth:`PublicationState.offer` / :meth:`claim` (one thread at a time;
  the driver's concurrent publication wraps them in a lock);
* the **sender** calls :meth:`on_status_message`, :meth:`on_nak`, :meth:`on_rttm` with received
  frames and :meth:`send` with ``now_ns`` and a ``transmit(data, address)`` callable; it returns
  the work done, and :attr:`next_deadline_ns` says when it next needs to be stepped without input.

Invariants:

* ``sender_position <= appender.position`` and only complete frames are ever sent (the appender
  advances ``position`` after ``frame_length`` is written).
* ``sender_limit`` never goes down: ``max(limit, sm_position + receiver_window)``.
* ``publisher_limit = sender_position + publication window`` while connected; while not
  connected it drops back to ``sender_position`` so offers answer NOT_CONNECTED.
* a retransmission is an exact copy of term bytes in
  ``[sender_position - term_length/2 - max_message_length, sender_position)``.
* Retransmits (Aeron's ``RetransmitHandler``): a range queued or resent less than
  ``retransmit_linger_ns`` ago is not resent again (a NAK overlapping it resends only the part
  not covered), and the bytes of the ranges still lingering never exceed the receiver window of
  the last SM (at least one mtu): a flood of NAKs cannot make the sender resend more than one
  window per linger. What is not resent is counted in ``retransmits_suppressed``; the receiver
  NAKs it again later.
* Nothing is sent before the first SM except SETUP (every 100 ms); after the first SM SETUP is
  only sent again when an SM asks for it (SEND_SETUP) and never after EOS.

Lifecycle (:data:`PUBLICATION_TRANSITIONS`; every change of :attr:`PublicationState.phase` goes
through it, an event it does not list raises :class:`LocalProtocolError`)::

    ACTIVE --close--> DRAINING                 (offers answer CLOSED from here on)
    DRAINING --nothing_to_drain--> CLOSED      (no receiver was connected at close: no EOS)
    DRAINING --eos_sent--> LINGER              (all offered data sent, then an EOS heartbeat)
    DRAINING --receivers_gone--> LINGER        (no receiver left: the rest cannot be drained)
    LINGER --eos_sent--> LINGER                (EOS heartbeats repeat while lingering)
    LINGER --linger_expired--> CLOSED          (``linger_ns`` after entering LINGER)
    LINGER --eos_acknowledged--> CLOSED        (EOS sent and every receiver answered EOS/left)
    any --close--> itself (but ACTIVE)         (closing twice is allowed)

``close`` is the client's (one thread) and only ever leaves ACTIVE; every later event is the
sender's, so two threads never race on one transition. CLOSED is terminal: a closed
publication sends nothing and the driver frees it (``is_done``).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

from aeron_spark.transport.api import BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED, NOT_CONNECTED
from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    RTTM_REPLY_FLAG,
    DataFlags,
    FrameType,
    NakFrame,
    RttMeasurement,
    SetupFrame,
    SmFlags,
    StatusMessage,
)
from aeron_spark.transport.protocol.lifecycle import step
from aeron_spark.transport.protocol.logbuffer import (
    PARTITION_COUNT,
    LogGeometry,
    allocate_log,
    compute_position,
    wrap_int32,
)
from aeron_spark.transport.protocol.term import TermAppender, scan_for_send

SETUP_INTERVAL_NS = 100_000_000
HEARTBEAT_INTERVAL_NS = 100_000_000
CONNECTION_TIMEOUT_NS = 5_000_000_000
# A SETUP request refused because its host was not allowed is answered if the host is allowed
# within this time (before its next elicit, ELICIT_INTERVAL_NS later, would be); at most this
# many such requests are remembered.
REFUSED_ELICIT_NS = 100_000_000
REFUSED_ELICITS_MAX = 64
RETRANSMIT_LINGER_NS = 10_000_000
MAX_RETRANSMIT_RANGES = 256  # lingering retransmit ranges tracked; NAKs past this wait
DATAGRAMS_PER_SEND = 64  # datagrams per publication per send() call: bounds one step's work

_I32 = struct.Struct("<i")
_i32_from = _I32.unpack_from
_TAIL = struct.Struct("<BBhiiiiq")

Address = Any  # a socket address tuple: (host, port) or (host, port, flow, scope)
Transmit = Callable[[Any, Address], None]


class PublicationPhase(enum.Enum):
    ACTIVE = "active"
    DRAINING = "draining"
    LINGER = "linger"
    CLOSED = "closed"


class PublicationEvent(enum.Enum):
    CLOSE = "close"
    NOTHING_TO_DRAIN = "nothing_to_drain"
    EOS_SENT = "eos_sent"
    RECEIVERS_GONE = "receivers_gone"
    LINGER_EXPIRED = "linger_expired"
    EOS_ACKNOWLEDGED = "eos_acknowledged"


_P = PublicationPhase
_PE = PublicationEvent
PUBLICATION_TRANSITIONS: dict[tuple[PublicationPhase, PublicationEvent], PublicationPhase] = {
    (_P.ACTIVE, _PE.CLOSE): _P.DRAINING,
    (_P.DRAINING, _PE.CLOSE): _P.DRAINING,
    (_P.DRAINING, _PE.NOTHING_TO_DRAIN): _P.CLOSED,
    (_P.DRAINING, _PE.EOS_SENT): _P.LINGER,
    (_P.DRAINING, _PE.RECEIVERS_GONE): _P.LINGER,
    (_P.LINGER, _PE.CLOSE): _P.LINGER,
    (_P.LINGER, _PE.EOS_SENT): _P.LINGER,
    (_P.LINGER, _PE.LINGER_EXPIRED): _P.CLOSED,
    (_P.LINGER, _PE.EOS_ACKNOWLEDGED): _P.CLOSED,
    (_P.CLOSED, _PE.CLOSE): _P.CLOSED,
}
_ACTIVE = _P.ACTIVE
_DRAINING = _P.DRAINING
_LINGER = _P.LINGER
_CLOSED = _P.CLOSED


class Destination:
    """One place data goes: the unicast endpoint, or a receiver learned from its SMs (MDC)."""

    __slots__ = ("address", "last_seen_ns", "receiver_ids", "needs_setup", "window")

    def __init__(self, address: Address, now_ns: int, window: int = 0) -> None:
        self.address = address
        self.last_seen_ns = now_ns
        self.receiver_ids: set[int] = set()
        self.needs_setup = True
        self.window = window  # the receiver window of its last SM: bounds its retransmits


def host_of(address: Address) -> str:
    """The IP address of a socket address, IPv4-mapped IPv6 addresses as IPv4."""
    host = str(address[0])
    return host[7:] if host.startswith("::ffff:") and "." in host else host


class PublicationState:
    """Log buffer, appender, flow control, SETUP/heartbeat/EOS and retransmits of one session."""

    def __init__(
        self,
        *,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        term_id: int,
        term_offset: int,
        term_length: int,
        mtu: int,
        publication_window_length: int = 0,
        linger_ns: int = 5_000_000_000,
        retransmit_linger_ns: int = RETRANSMIT_LINGER_NS,
        destination: Address | None = None,
        dynamic: bool = False,
        now_ns: int = 0,
    ) -> None:
        self.geometry = LogGeometry(term_length, mtu, initial_term_id)
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.mtu = mtu
        self.shift = self.geometry.shift
        self.max_message_length = self.geometry.max_message_length
        self.max_payload_length = self.geometry.max_payload_length
        self.linger_ns = linger_ns
        self.retransmit_linger_ns = retransmit_linger_ns
        self.window = publication_window_length or term_length // 2
        self.log = allocate_log(PARTITION_COUNT * term_length)
        view = memoryview(self.log)
        self.terms = [view[i * term_length : (i + 1) * term_length] for i in range(PARTITION_COUNT)]
        self.appender = TermAppender(
            self.geometry, self.terms, session_id, stream_id, term_id, term_offset
        )
        start = self.appender.position
        self.start_position = start
        self._max_position = 0
        self._max_position_guard = 0
        self.max_position = (1 << 31) * term_length - 1  # int32 term count, as Aeron
        self.sender_position = start
        self.sender_limit = start
        self.publisher_limit = start
        self.has_initial_connection = False
        self.dynamic = dynamic
        # Who may become a destination of a dynamic publication (None: anyone who sends an SM;
        # replaced whole by other threads, read by the sender), how many at most (0: no limit),
        # and whether only an SM carrying this publication's own session id makes one (a
        # session-0 "send me SETUPs" SM from a stranger then gets nothing).
        self.allowed_hosts: frozenset[str] | None = None
        self.max_destinations = 0
        self.session_sm_only = False
        self.destinations: dict[Address, Destination] = {}
        self.destination_hosts: frozenset[str] = frozenset()  # replaced whole: read anywhere
        # SETUP requests refused only because their host was not allowed yet (a handshake
        # client elicits the replies before its HELLO image makes the server allow it): source
        # -> (session id, when). Answered once if the host is allowed within REFUSED_ELICIT_NS,
        # as if they came then: the same SETUP an allowed host gets, within the same sending
        # bounds; at most REFUSED_ELICITS_MAX remembered (the oldest go first).
        self.refused_elicits: dict[Address, tuple[int, int]] = {}
        self._refused_seen_allowed: frozenset[str] | None = None
        if destination is not None:
            self.destinations[destination] = Destination(destination, now_ns)
        self.receivers: dict[int, int] = {}  # receiver_id -> last SM time
        self.setup_deadline_ns = now_ns
        self.heartbeat_deadline_ns = now_ns + HEARTBEAT_INTERVAL_NS
        self.phase = PublicationPhase.ACTIVE  # changed only by _fire (PUBLICATION_TRANSITIONS)
        self.is_eos_sent = False
        self.linger_deadline_ns: int | None = None  # set on entering LINGER or CLOSED
        self.closed_at_ns: int | None = None  # when the client closed it
        self._undrainable = False  # no receiver was connected when the client closed it
        self.transitions = 0  # phase changes so far (a closed publication made at most 3)
        # (start, end, linger until, destination or None for all)
        self.retransmit_ranges: list[tuple[int, int, int, Any]] = []
        self.retransmit_window = self.window  # the receiver window of the last SM
        self.status_messages_received = 0
        self.naks_received = 0
        self.retransmits_sent = 0
        self.retransmitted_bytes = 0
        self.retransmits_suppressed = 0
        self.heartbeats_sent = 0
        self.setups_sent = 0
        self.bytes_sent = 0
        self.invalid_naks = 0
        self.status_messages_refused = 0  # SMs from a source that is not (may not be) a destination
        # SETUP requests from a host not allowed yet, held for REFUSED_ELICIT_NS (an honest
        # handshake client's first one arrives before its HELLO): answered once its host is
        # allowed, else counted in status_messages_refused as they expire
        self.status_messages_deferred = 0
        self.naks_refused = 0  # NAKs from a source that is not a destination
        self.back_pressure_events = 0
        self.pending: list[tuple[Any, Address]] = []  # replies to control frames, sent on send()
        self.on_limit_change: Callable[[], None] | None = None
        self.spies: tuple[Any, ...] = ()  # images reading this log in-process (aeron-spy)

    # ------------------------------------------------------------------ lifecycle

    def _fire(self, event: PublicationEvent) -> None:
        phase = step(PUBLICATION_TRANSITIONS, self.phase, event, "publication")
        if phase is not self.phase:  # a self-loop writes nothing: no race with the other thread
            self.phase = phase
            self.transitions += 1

    @property
    def is_closed(self) -> bool:
        """The client closed it (DRAINING, LINGER or CLOSED): offers answer CLOSED."""
        return self.phase is not _ACTIVE

    @property
    def is_done(self) -> bool:
        """CLOSED: the driver may free it."""
        return self.phase is _CLOSED

    # ------------------------------------------------------------------ client side

    @property
    def max_position(self) -> int:
        return self._max_position

    @max_position.setter
    def max_position(self, value: int) -> None:
        self._max_position = value
        self._max_position_guard = value - 2 * self.term_length - 2 * self.max_message_length

    @property
    def position(self) -> int:
        return self.appender.position

    @property
    def is_connected(self) -> bool:
        return bool(self.receivers) and not self.is_closed

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message; the new position, or a negative result code."""
        if self.phase is not _ACTIVE:
            return CLOSED
        length = len(payload)
        if length > self.max_message_length:
            raise LocalProtocolError(
                f"message of {length} bytes exceeds max_message_length {self.max_message_length}"
            )
        appender = self.appender
        position = appender.position
        if position < self.publisher_limit:
            if position > self._max_position_guard and (
                position + appender.required_length(length) > self.max_position
            ):
                return MAX_POSITION_EXCEEDED
            return appender.append(payload, reserved_value)
        if self.receivers:
            self.back_pressure_events += 1
            return BACK_PRESSURED
        return NOT_CONNECTED

    def offer_block(self, block: bytes | bytearray | memoryview) -> int:
        """Append a block of whole, already framed fragments into the current term (Aeron's
        ``ExclusivePublication.offerBlock``; :meth:`TermAppender.append_block` says what a
        block must be); the new position, or a negative result code. A full term is rotated
        first; a block that does not fit the rest of the term raises
        :class:`LocalProtocolError` (split blocks at term ends)."""
        if self.phase is not _ACTIVE:
            return CLOSED
        appender = self.appender
        if appender.term_offset >= self.term_length:
            appender._pad_and_rotate()  # nothing left to pad: just the next term
        position = appender.position
        if position < self.publisher_limit:
            if position + len(block) > self.max_position:
                return MAX_POSITION_EXCEEDED
            return appender.append_block(block)
        if self.receivers:
            self.back_pressure_events += 1
            return BACK_PRESSURED
        return NOT_CONNECTED

    @property
    def max_position_guard(self) -> int:
        """Below this position no message can reach ``max_position`` (skips the exact check)."""
        return self._max_position_guard

    def claim_check(self, length: int) -> int:
        """0 if ``length`` bytes may be claimed now, else a negative result code."""
        if self.phase is not _ACTIVE:
            return CLOSED
        if length > self.max_payload_length:
            raise LocalProtocolError(
                f"try_claim of {length} bytes exceeds max_payload_length {self.max_payload_length}"
            )
        position = self.appender.position
        if position < self.publisher_limit:
            if position + self.appender.required_length(length) > self.max_position:
                return MAX_POSITION_EXCEEDED
            return 0
        if self.receivers:
            self.back_pressure_events += 1
            return BACK_PRESSURED
        return NOT_CONNECTED

    def close(self, now_ns: int) -> None:
        """The client is done: drain what was offered, then EOS heartbeats for the linger time.

        With no receiver connected there is nobody to drain to: the next :meth:`send` closes it.
        """
        if self.phase is not _ACTIVE:
            self._fire(PublicationEvent.CLOSE)  # closing twice is allowed (a self-loop)
            return
        # What the sender reads once it sees DRAINING is written before the transition.
        self._undrainable = not self.has_initial_connection or not self.receivers
        self.closed_at_ns = now_ns
        self.heartbeat_deadline_ns = now_ns  # EOS goes out as soon as the log is drained
        self._fire(PublicationEvent.CLOSE)
        self.publisher_limit = self.appender.position

    # ------------------------------------------------------------------ sender side

    def sm_position(self, sm: StatusMessage) -> int:
        return compute_position(
            sm.consumption_term_id, sm.consumption_term_offset, self.shift, self.initial_term_id
        )

    def on_status_message(self, sm: StatusMessage, source: Address, now_ns: int) -> None:
        """Flow control, connection tracking, SETUP requests and (MDC dynamic) destinations."""
        self.status_messages_received += 1
        flags = sm.flags
        if self.dynamic:
            dest = self.destinations.get(source)
            allowed = self.allowed_hosts
            if dest is None:
                if flags & SmFlags.EOS:
                    return
                if not self.may_add_destination(source, sm.session_id):
                    if (
                        flags & SmFlags.SEND_SETUP
                        and allowed is not None
                        and host_of(source) not in allowed
                        and not (self.session_sm_only and sm.session_id != self.session_id)
                    ):
                        # refused only for its host, perhaps an honest client's allowed a moment
                        # later (a handshake client asks before its HELLO arrives): deferred,
                        # and refused if its host is not allowed in time (_answer_refused)
                        self._remember_refused(source, sm.session_id, now_ns)
                    else:
                        self.status_messages_refused += 1
                    return
                dest = self.destinations[source] = Destination(source, now_ns, self.window)
                self._hosts_changed()
            elif allowed is not None and host_of(source) not in allowed:
                self._drop_destination(source)  # no longer allowed (its handshake ended)
                self.status_messages_refused += 1
                return
            dest.last_seen_ns = now_ns
        else:
            dest = None
        if flags & SmFlags.SEND_SETUP:
            if not self.is_eos_sent and not self.is_closed:
                self.setup_deadline_ns = now_ns
                if dest is not None:
                    dest.needs_setup = True
                else:
                    for d in self.destinations.values():
                        d.needs_setup = True
            return
        if sm.session_id != self.session_id:
            return
        if flags & SmFlags.EOS:
            self.receivers.pop(sm.receiver_id, None)
            if dest is not None:
                dest.receiver_ids.discard(sm.receiver_id)
                if not dest.receiver_ids:
                    del self.destinations[source]
                    self._hosts_changed()
            self._update_publisher_limit()
            return
        self.receivers[sm.receiver_id] = now_ns
        if dest is not None:
            dest.receiver_ids.add(sm.receiver_id)
            dest.needs_setup = False
        elif not self.dynamic:
            for d in self.destinations.values():
                d.needs_setup = False
        self.has_initial_connection = True
        if sm.receiver_window > 0:
            self.retransmit_window = sm.receiver_window
            if dest is not None:
                dest.window = sm.receiver_window
        proposed = self.sm_position(sm) + sm.receiver_window
        if proposed > self.sender_limit:
            self.sender_limit = proposed
        self._update_publisher_limit()

    def may_add_destination(self, source: Address, session_id: int) -> bool:
        """Whether an SM from ``source`` (for ``session_id``) may make it a destination."""
        if self.session_sm_only and session_id != self.session_id:
            return False
        if self.max_destinations and len(self.destinations) >= self.max_destinations:
            return False
        allowed = self.allowed_hosts
        return allowed is None or host_of(source) in allowed

    def _remember_refused(self, source: Address, session_id: int, now_ns: int) -> None:
        refused = self.refused_elicits
        if refused.pop(source, None) is None:  # a repeated request renews the one held
            self.status_messages_deferred += 1
        if len(refused) >= REFUSED_ELICITS_MAX:
            del refused[next(iter(refused))]
            self.status_messages_refused += 1
        refused[source] = (session_id, now_ns)
        self._refused_seen_allowed = self.allowed_hosts

    def _refused_due(self, now_ns: int) -> bool:
        """Whether :meth:`_answer_refused` has work: the allowed hosts changed, or the oldest
        held request expired (held in arrival order, so the first is the oldest)."""
        refused = self.refused_elicits
        if not refused:
            return False
        if self.allowed_hosts is not self._refused_seen_allowed:
            return True
        return now_ns - next(iter(refused.values()))[1] > REFUSED_ELICIT_NS

    def _answer_refused(self, now_ns: int) -> None:
        """The allowed hosts changed: refused SETUP requests of a now allowed host, recent
        enough, become destinations that get a SETUP now (each answered once)."""
        allowed = self._refused_seen_allowed = self.allowed_hosts
        for source, (session_id, at) in list(self.refused_elicits.items()):
            if now_ns - at > REFUSED_ELICIT_NS:
                del self.refused_elicits[source]
                if allowed is not None and host_of(source) not in allowed:
                    self.status_messages_refused += 1  # its host was not allowed in time
            elif allowed is None or host_of(source) in allowed:
                del self.refused_elicits[source]
                if source in self.destinations:
                    continue
                if not self.may_add_destination(source, session_id):
                    self.status_messages_refused += 1
                    continue
                self.destinations[source] = Destination(source, now_ns, self.window)
                self._hosts_changed()
                self.setup_deadline_ns = now_ns

    def _hosts_changed(self) -> None:
        self.destination_hosts = frozenset(host_of(a) for a in self.destinations)

    def _drop_destination(self, address: Address) -> None:
        dest = self.destinations.pop(address, None)
        if dest is not None:
            self._hosts_changed()
            for rid in dest.receiver_ids:
                self.receivers.pop(rid, None)
            self._update_publisher_limit()

    def on_nak(self, nak: NakFrame, now_ns: int, source: Address | None = None) -> int:
        """Resend exactly the original bytes of a lost range; returns datagrams queued.

        A dynamic publication takes NAKs only from its destinations (others are counted in
        ``naks_refused``) and resends only to the one that asked. Parts of the range queued or
        resent to it within the linger are skipped, and what would take its lingering bytes past
        its receiver window is refused (both counted as suppressed).
        """
        dest: Destination | None = None
        if self.dynamic:
            dest = self.destinations.get(source) if source is not None else None
            if dest is None:
                self.naks_refused += 1
                return 0
        self.naks_received += 1
        term_offset = nak.term_offset
        if (
            not 0 <= term_offset <= self.term_length - DATA_HEADER_LENGTH
            or term_offset & (FRAME_ALIGNMENT - 1)
            or nak.length <= 0
        ):
            self.invalid_naks += 1
            return 0
        start = compute_position(nak.term_id, term_offset, self.shift, self.initial_term_id)
        low = self.sender_position - self.term_length // 2 - self.max_message_length
        if start < low or start >= self.sender_position:
            return 0
        end = start + min(nak.length, self.term_length - term_offset, self.sender_position - start)
        ranges = self.retransmit_ranges
        if ranges and any(r[2] <= now_ns for r in ranges):
            ranges = self.retransmit_ranges = [r for r in ranges if r[2] > now_ns]
        to = dest.address if dest is not None else None
        pieces = [(start, end)]
        lingering = 0
        for r_start, r_end, _, r_to in ranges:
            if r_to != to:
                continue
            lingering += r_end - r_start
            if r_end <= start or r_start >= end:
                continue
            cut: list[tuple[int, int]] = []
            for p_start, p_end in pieces:
                if r_end <= p_start or r_start >= p_end:
                    cut.append((p_start, p_end))
                    continue
                if p_start < r_start:
                    cut.append((p_start, r_start))
                if r_end < p_end:
                    cut.append((r_end, p_end))
            pieces = cut
        suppressed = len(pieces) != 1 or pieces[0] != (start, end)
        window = dest.window if dest is not None else self.retransmit_window
        budget = max(window, self.mtu) - lingering
        queued = 0
        for p_start, p_end in pieces:
            if budget <= 0 or len(ranges) >= MAX_RETRANSMIT_RANGES:
                suppressed = True
                break
            if p_end - p_start > budget:
                p_end = p_start + budget
                suppressed = True
            count, resent = self._resend(p_start, p_end, to)
            if resent == 0:
                suppressed = True
                break
            queued += count
            budget -= resent
            ranges.append((p_start, p_start + resent, now_ns + self.retransmit_linger_ns, to))
        if suppressed:
            self.retransmits_suppressed += 1
        return queued

    def _resend(self, start: int, end: int, to: Address | None = None) -> tuple[int, int]:
        """Queue the datagrams of whole frames in ``[start, end)`` (to ``to``, else to every
        destination): (datagrams, bytes covered)."""
        targets = [to] if to is not None else [d.address for d in self.destinations.values()]
        term = self.terms[(start >> self.shift) % PARTITION_COUNT]
        offset = first = start & (self.term_length - 1)
        stop = offset + (end - start)
        queued = 0
        while offset < stop:
            to_send, advance = scan_for_send(term, offset, stop - offset, self.mtu)
            if advance == 0:
                break
            data = bytes(term[offset : offset + to_send])
            for address in targets:
                self.pending.append((data, address))
            self.retransmits_sent += 1
            self.retransmitted_bytes += to_send
            queued += 1
            offset += advance
        return queued, offset - first

    def on_rttm(self, rttm: RttMeasurement, source: Address) -> None:
        if rttm.flags & RTTM_REPLY_FLAG:
            reply = RttMeasurement(
                self.session_id, self.stream_id, rttm.echo_timestamp, 0, rttm.receiver_id, 0
            )
            self.pending.append((reply.encode(), source))

    def _update_publisher_limit(self) -> None:
        if self.is_closed:
            return
        if self.receivers:
            consumer = self.sender_position
            for spy in self.spies:
                if spy.subscriber_position < consumer:
                    consumer = spy.subscriber_position
            limit = consumer + self.window
            if limit > self.publisher_limit:
                self.publisher_limit = limit
                if self.on_limit_change is not None:
                    self.on_limit_change()
        elif self.publisher_limit != self.sender_position:
            # nobody connected: the limit is where the sender is, also after the sender went on
            # with what was appended before the receivers timed out (offers stay NOT_CONNECTED)
            self.publisher_limit = self.sender_position
            if self.on_limit_change is not None:
                self.on_limit_change()

    def setup_frame(self) -> bytes:
        position = self.sender_position
        return SetupFrame(
            term_offset=position & (self.term_length - 1),
            session_id=self.session_id,
            stream_id=self.stream_id,
            initial_term_id=self.initial_term_id,
            active_term_id=wrap_int32(self.initial_term_id + (position >> self.shift)),
            term_length=self.term_length,
            mtu=self.mtu,
        ).encode()

    def heartbeat_frame(self) -> bytes:
        position = self.sender_position
        flags = DataFlags.UNFRAGMENTED
        if self.is_closed and position >= self.appender.position:
            flags |= DataFlags.EOS
        return DATA_HEADER.pack(
            0,
            0,
            flags,
            FrameType.DATA,
            position & (self.term_length - 1),
            self.session_id,
            self.stream_id,
            wrap_int32(self.initial_term_id + (position >> self.shift)),
            0,
        )

    def has_data_to_send(self) -> bool:
        """True when :meth:`send` would send data now (used before a driver goes to sleep)."""
        position = self.sender_position
        if position < self.appender.position and position < self.sender_limit:
            term = self.terms[(position >> self.shift) % PARTITION_COUNT]
            offset = position & (self.term_length - 1)
            length = _i32_from(term, offset)[0]
            if length <= 0:
                return False  # a claim not yet committed
            if term[offset + 6] == FrameType.PAD:
                return True
            return (length + 31) & -32 <= self.sender_limit - position
        return False

    def claim(self, length: int, reserved_value: int = 0) -> tuple[memoryview, int]:
        """Reserve a frame for ``length`` bytes (checked with :meth:`claim_check` first).

        The frame's ``frame_length`` is written negative, so neither the sender nor a reader
        passes it until :func:`commit_claim` (or :func:`abort_claim`) makes it positive.
        Returns ``(term, frame_offset)``.
        """
        appender = self.appender
        aligned = (length + DATA_HEADER_LENGTH + 31) & -32
        if appender.term_offset + aligned > self.term_length:
            appender._pad_and_rotate()
        term = self.terms[appender.partition]
        offset = appender.term_offset
        _TAIL.pack_into(
            term,
            offset + 4,
            0,
            DataFlags.UNFRAGMENTED,
            FrameType.DATA,
            offset,
            self.session_id,
            self.stream_id,
            appender.term_id,
            reserved_value,
        )
        _I32.pack_into(term, offset, -(length + DATA_HEADER_LENGTH))
        appender.term_offset = offset + aligned
        appender.position += aligned
        return term, offset

    def send(self, now_ns: int, transmit: Transmit) -> int:
        """Send what is due: replies, SETUP, data up to the sender limit, heartbeats; work count."""
        phase = self.phase
        if phase is not _ACTIVE:
            if phase is _CLOSED:
                return 0
            if phase is _DRAINING and self._undrainable:
                self._fire(PublicationEvent.NOTHING_TO_DRAIN)
                self.linger_deadline_ns = now_ns
                self.pending = []
                return 0
        work = 0
        if self.pending:
            pending, self.pending = self.pending, []
            for data, address in pending:
                transmit(data, address)
            work += len(pending)
        if self.refused_elicits and self._refused_due(now_ns):
            self._answer_refused(now_ns)
        if self.dynamic and self.destinations:
            self._expire_destinations(now_ns)
        if now_ns >= self.setup_deadline_ns and not self.is_eos_sent:
            targets = [
                d
                for d in self.destinations.values()
                if d.needs_setup or not self.has_initial_connection
            ]
            if targets:
                frame = self.setup_frame()
                for dest in targets:
                    transmit(frame, dest.address)
                    self.setups_sent += 1
                work += 1
                self.setup_deadline_ns = now_ns + SETUP_INTERVAL_NS
            else:
                self.setup_deadline_ns = now_ns + SETUP_INTERVAL_NS
        if self.receivers:
            expired = [
                rid for rid, seen in self.receivers.items() if now_ns - seen > CONNECTION_TIMEOUT_NS
            ]
            for rid in expired:
                del self.receivers[rid]
            if expired:
                self._update_publisher_limit()
        if not self.has_initial_connection:
            return work
        sent = self._send_data(transmit)
        if sent:
            if self.is_closed and self.sender_position >= self.appender.position:
                self.heartbeat_deadline_ns = now_ns  # drained: EOS on the next step
            else:
                self.heartbeat_deadline_ns = now_ns + HEARTBEAT_INTERVAL_NS
            work += sent
            self._update_publisher_limit()
        elif now_ns >= self.heartbeat_deadline_ns:
            frame = self.heartbeat_frame()
            for dest in self.destinations.values():
                transmit(frame, dest.address)
            self.heartbeats_sent += 1
            self.heartbeat_deadline_ns = now_ns + HEARTBEAT_INTERVAL_NS
            if frame[5] & DataFlags.EOS:
                self.is_eos_sent = True
                if self.phase is _DRAINING:
                    self.linger_deadline_ns = now_ns + self.linger_ns
                self._fire(PublicationEvent.EOS_SENT)
            work += 1
        if self.phase is _DRAINING and not self.receivers:
            # Aeron's DRAINING with nobody connected: what no receiver will take cannot be
            # drained (flow control holds it back), so linger and free the log.
            self._fire(PublicationEvent.RECEIVERS_GONE)
            self.linger_deadline_ns = now_ns + self.linger_ns
        if self.phase is _LINGER:
            assert self.linger_deadline_ns is not None
            if now_ns >= self.linger_deadline_ns:
                self._fire(PublicationEvent.LINGER_EXPIRED)
            elif self.is_eos_sent and not self.receivers:
                self._fire(PublicationEvent.EOS_ACKNOWLEDGED)
        return work

    def _send_data(self, transmit: Transmit) -> int:
        position = self.sender_position
        limit = min(self.appender.position, self.sender_limit)
        if position >= limit:
            return 0
        mtu = self.mtu
        term_length = self.term_length
        shift = self.shift
        terms = self.terms
        addresses = [d.address for d in self.destinations.values()]
        datagrams = 0
        sent_bytes = 0
        while position < limit and datagrams < DATAGRAMS_PER_SEND:
            offset = position & (term_length - 1)
            term = terms[(position >> shift) % PARTITION_COUNT]
            available = limit - position
            rest = term_length - offset
            to_send, advance = scan_for_send(
                term, offset, available if available < rest else rest, mtu
            )
            if advance == 0:
                break
            data = term[offset : offset + to_send]
            for address in addresses:
                transmit(data, address)
            datagrams += 1
            sent_bytes += to_send
            position += advance
        self.sender_position = position
        self.bytes_sent += sent_bytes * len(addresses)
        return datagrams

    def _expire_destinations(self, now_ns: int) -> None:
        allowed = self.allowed_hosts
        stale = [
            a
            for a, d in self.destinations.items()
            if now_ns - d.last_seen_ns > CONNECTION_TIMEOUT_NS
            or (allowed is not None and host_of(a) not in allowed)
        ]
        for address in stale:
            dest = self.destinations.pop(address)
            for rid in dest.receiver_ids:
                self.receivers.pop(rid, None)
        if stale:
            self._hosts_changed()

    @property
    def next_deadline_ns(self) -> int:
        """Earliest time :meth:`send` has something to do without new input."""
        deadline = (
            self.setup_deadline_ns
            if not self.has_initial_connection
            else self.heartbeat_deadline_ns
        )
        if self.has_initial_connection and any(d.needs_setup for d in self.destinations.values()):
            deadline = min(deadline, self.setup_deadline_ns)
        phase = self.phase
        if phase is _LINGER and self.linger_deadline_ns is not None:
            deadline = min(deadline, self.linger_deadline_ns)
        elif phase is _DRAINING and self._undrainable and self.closed_at_ns is not None:
            deadline = min(deadline, self.closed_at_ns)  # to be closed on the next send
        return deadline


def commit_claim(term: memoryview, offset: int) -> None:
    """Publish a claimed frame: its ``frame_length`` becomes positive."""
    length = _i32_from(term, offset)[0]
    if length < 0:
        _I32.pack_into(term, offset, -length)


def abort_claim(term: memoryview, offset: int) -> None:
    """Turn a claimed frame into padding, which readers skip."""
    length = _i32_from(term, offset)[0]
    if length < 0:
        term[offset + 6] = FrameType.PAD
        term[offset + 7] = 0
        _I32.pack_into(term, offset, -length)

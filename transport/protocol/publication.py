"""Sans-I/O state of one network publication: the client's log buffer and the sender's view of it.

Each rule has a module of its own (as Aeron C's driver): :mod:`.flow_control` (receivers, sender
limit), :mod:`.destinations` (where data goes, who may become a destination, held SETUP
requests), :mod:`.retransmit` (what a NAK resends), :mod:`.heartbeat` (SETUP, heartbeat and RTTM
frames); the appender is :class:`~.term.TermAppender`. This class holds the log and the
lifecycle and steps those parts with ``now_ns``.

The same object serves both sides of Aeron's split, as they share one process here:

* the **client** appends with :meth:`PublicationState.offer` / :meth:`claim` (one thread at a time;
  the driver's concurrent publication wraps them in a lock);
* the **sender** calls :meth:`on_status_message`, :meth:`on_nak`, :meth:`on_rttm` with received
  frames and :meth:`send` with ``now_ns`` and a ``transmit(data, address)`` callable; it returns
  the work done, and :attr:`next_deadline_ns` says when it next needs to be stepped without input.

Invariants:

* ``sender_position <= appender.position`` and only complete frames are ever sent (the appender
  advances ``position`` after ``frame_length`` is written).
* ``sender_limit`` never goes down: ``max(limit, sm_position + receiver_window)``. An SM
  beyond ``sender_position`` (or before 0) is refused and counted (``status_messages_refused``).
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
import mmap
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from aeron_spark.transport.api import BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED, NOT_CONNECTED
from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.destinations import (
    REFUSED_ELICIT_NS,
    REFUSED_ELICITS_MAX,
    Destination,
    Destinations,
    host_of,
)
from aeron_spark.transport.protocol.flow_control import (
    CONNECTION_TIMEOUT_NS,
    FlowControl,
    FlowControlPolicy,
    make_flow_control,
)
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER_LENGTH,
    DATA_HEADER_TAIL,
    FRAME_ALIGNMENT,
    RTTM_REPLY_FLAG,
    DataFlags,
    FrameType,
    NakFrame,
    RttMeasurement,
    SmFlags,
    StatusMessage,
)
from aeron_spark.transport.protocol.heartbeat import (
    HEARTBEAT_INTERVAL_NS,
    SETUP_INTERVAL_NS,
    heartbeat_frame,
    rttm_reply,
    setup_frame,
)
from aeron_spark.transport.protocol.lifecycle import step
from aeron_spark.transport.protocol.logbuffer import (
    PARTITION_COUNT,
    LogGeometry,
    allocate_log,
    compute_position,
    release_chunk,
    release_positions,
    release_range,
)
from aeron_spark.transport.protocol.retransmit import (
    MAX_RETRANSMIT_RANGES,
    RETRANSMIT_LINGER_NS,
    RetransmitHandler,
)
from aeron_spark.transport.protocol.schedule import IDLE_GRID_NS
from aeron_spark.transport.protocol.segments import datagrams, segment_runs
from aeron_spark.transport.protocol.tally import counter
from aeron_spark.transport.protocol.term import TermAppender

__all__ = [
    "CONNECTION_TIMEOUT_NS",
    "HEARTBEAT_INTERVAL_NS",
    "MAX_RETRANSMIT_RANGES",
    "PUBLICATION_TRANSITIONS",
    "REFUSED_ELICITS_MAX",
    "REFUSED_ELICIT_NS",
    "RETRANSMIT_LINGER_NS",
    "SETUP_INTERVAL_NS",
    "Destination",
    "PublicationEvent",
    "PublicationPhase",
    "PublicationState",
    "abort_claim",
    "commit_claim",
    "host_of",
]

DATAGRAMS_PER_SEND = 64  # datagrams per publication per send() call: bounds one step's work

_I32 = struct.Struct("<i")
_i32_from = _I32.unpack_from
_TAIL = DATA_HEADER_TAIL
# flags as plain ints on the per-datagram path (an IntFlag operation builds an enum member:
# most of a status message's handling; issue 31)
_SM_EOS = int(SmFlags.EOS)
_SM_SEND_SETUP = int(SmFlags.SEND_SETUP)
_DATA_EOS = int(DataFlags.EOS)

Address = Any  # a socket address tuple: (host, port) or (host, port, flow, scope)
Transmit = Callable[[Any, Address], None]
# transmit_segments(data, segment_length, address): the datagrams of ``data`` cut every
# ``segment_length`` bytes (the last may be shorter), in one send where the socket can (UDP GSO)
TransmitSegments = Callable[[Any, int, Address], None]


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


def _part(part: str, name: str, doc: str) -> Any:
    """A property reading and writing ``self.<part>.<name>`` (the names other modules use)."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, part), name)

    def set_(self: Any, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, set_, doc=doc)


class PublicationState:
    """Log buffer, appender, flow control, SETUP/heartbeat/EOS and retransmits of one session."""

    # its counters' keys in a driver's positions snapshot, made by the first snapshot
    position_keys: tuple[str, ...] = ()
    # what it counts, also added to its driver's running totals (tally.py: no walk)
    status_messages_received: int = counter()
    naks_received: int = counter()
    retransmits_sent: int = counter()
    retransmitted_bytes: int = counter()
    heartbeats_sent: int = counter()
    setups_sent: int = counter()
    invalid_naks: int = counter("invalid_frames")
    naks_refused: int = counter()
    back_pressure_events: int = counter(locked=True)  # counted by the offering threads

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
        idle_heartbeat_interval_ns: int = 0,
        destination: Address | None = None,
        dynamic: bool = False,
        now_ns: int = 0,
        flow_control: FlowControlPolicy | None = None,
        connection_timeout_ns: int = CONNECTION_TIMEOUT_NS,
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
        self.window = publication_window_length or term_length // 2
        self.log = allocate_log(PARTITION_COUNT * term_length)
        view = self.log_view = memoryview(self.log)
        self.terms = [view[i * term_length : (i + 1) * term_length] for i in range(PARTITION_COUNT)]
        self.appender = TermAppender(
            self.geometry, self.terms, session_id, stream_id, term_id, term_offset
        )
        # the term the appender enters is cleaned by giving its pages back (they read as
        # zeros), not by writing zeros over them (which kept all three terms resident)
        self.appender.clean_on_rotate = False
        self.appender.on_rotate = self._release_term
        start = self.appender.position
        self._released_to = start  # pages below it (rounded) were given back
        # receiver_id -> the furthest consumption position its SMs reported: a receiver NAKs
        # only past it (what it has not rebuilt). Kept while it is within a NAK's reach of the
        # sender (a receiver that went quiet may come back), dropped at its EOS.
        self._receiver_positions: dict[int, int] = {}
        self._release_chunk = release_chunk(term_length)
        self.released_bytes = 0  # sent bytes past any NAK's reach whose pages were given back
        self.start_position = start
        self._max_position = 0
        self._max_position_guard = 0
        self.max_position = (1 << 31) * term_length - 1  # int32 term count, as Aeron
        self.sender_position = start
        self.publisher_limit = start
        # a receiver (a destination) silent this long is gone (aeron.publication.connection.timeout)
        self.flow = make_flow_control(flow_control, start, self.window, connection_timeout_ns)
        self.dynamic = dynamic
        self.dests = Destinations(session_id, connection_timeout_ns)
        if destination is not None:
            self.dests.add(destination, now_ns)
        self.retransmit = RetransmitHandler(retransmit_linger_ns)
        self.setup_deadline_ns = now_ns
        self.heartbeat_deadline_ns = now_ns + HEARTBEAT_INTERVAL_NS
        # the heartbeats after the first one of an idle stream (0: Aeron's 100 ms throughout)
        self.idle_heartbeat_interval_ns = idle_heartbeat_interval_ns or HEARTBEAT_INTERVAL_NS
        self.phase = PublicationPhase.ACTIVE  # changed only by _fire (PUBLICATION_TRANSITIONS)
        self.is_eos_sent = False
        self.linger_deadline_ns: int | None = None  # set on entering LINGER or CLOSED
        self.closed_at_ns: int | None = None  # when the client closed it
        self._undrainable = False  # no receiver was connected when the client closed it
        self.transitions = 0  # phase changes so far (a closed publication made at most 3)
        self.status_messages_received = 0
        self.naks_received = 0
        self.retransmits_sent = 0
        self.retransmitted_bytes = 0
        self.heartbeats_sent = 0
        self._heartbeat_key: tuple[int, bool] | None = None  # what _heartbeat says
        self._heartbeat = b""
        self.setups_sent = 0
        self.bytes_sent = 0
        self.invalid_naks = 0
        self.naks_refused = 0  # NAKs from a source that is not a destination
        self.back_pressure_events = 0
        # what control frames asked for, sent on send(): (data, segment length, address), the
        # datagrams of ``data`` cut every ``segment length`` bytes (0: one datagram)
        self.pending: list[tuple[Any, int, Address]] = []
        self.on_limit_change: Callable[[], None] | None = None
        # called (the sender's thread) whenever a receiver or a destination goes (its status
        # messages timed out, it ended its stream, its destination was dropped): is_connected
        # may have turned False. A session's owner learns of a lost peer so, without asking
        # every connection on a clock (issue 31: the stream server's check of every session a
        # second)
        self.on_receiver_lost: Callable[[], None] | None = None
        self.spies: tuple[Any, ...] = ()  # images reading this log in-process (aeron-spy)
        # Where kick() puts it for the sender (its endpoint's ready queue; None: nobody steps
        # it), and whether it is there already (cleared by the sender before it steps it).
        self.wakeups: deque[PublicationState] | None = None
        self.kicked = False

    # ------------------------------------------------------------------ the parts' state

    sender_limit = _part("flow", "sender_limit", "How far the sender may send (never goes down).")
    receivers = _part("flow", "receivers", "receiver_id -> time of its last SM.")
    has_initial_connection = _part("flow", "has_initial_connection", "An SM came (data may go).")
    retransmit_window = _part("flow", "retransmit_window", "The receiver window of the last SM.")
    destinations = _part("dests", "by_address", "address -> :class:`Destination`.")
    destination_hosts = _part("dests", "hosts", "The destinations' hosts (replaced whole).")
    allowed_hosts = _part("dests", "allowed_hosts", "Who may become a destination (None: any).")
    max_destinations = _part("dests", "max_destinations", "At most this many (0: no limit).")
    session_sm_only = _part("dests", "session_sm_only", "Only SMs naming our session id add one.")
    refused_elicits = _part("dests", "refused_elicits", "SETUP requests held for their host.")
    status_messages_refused = _part("dests", "status_messages_refused", "SMs refused (count).")
    status_messages_deferred = _part("dests", "status_messages_deferred", "SETUP requests held.")
    retransmit_ranges = _part("retransmit", "ranges", "Lingering retransmits.")
    retransmits_suppressed = _part("retransmit", "retransmits_suppressed", "NAKs cut (count).")
    retransmit_linger_ns = _part("retransmit", "linger_ns", "How long a resent range lingers.")

    def kick(self) -> None:
        """Something for the sender that no deadline says (data appended, closed, a host
        allowed): queue it to be stepped (any thread; at most once until it is stepped)."""
        wakeups = self.wakeups
        if wakeups is not None and not self.kicked:
            self.kicked = True
            wakeups.append(self)

    def hold_unclaimed_elicit(self, source: Address, session_id: int, at_ns: int) -> None:
        """A SETUP request that reached the socket before this publication existed (see
        :meth:`.Destinations.hold_unclaimed`): answered by the next :meth:`send` if allowed."""
        self.dests.hold_unclaimed(source, session_id, at_ns)

    def has_refused_changed(self) -> bool:
        """Held SETUP requests and their allowed hosts changed: :meth:`send` has work."""
        return self.dests.refused_changed()

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
        return self.flow.is_connected and not self.is_closed

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
        if self.flow.is_connected:
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
            appender.pad_and_rotate()  # nothing left to pad: just the next term
        position = appender.position
        if position < self.publisher_limit:
            if position + len(block) > self.max_position:
                return MAX_POSITION_EXCEEDED
            return appender.append_block(block)
        if self.flow.is_connected:
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
        if self.flow.is_connected:
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
        self._undrainable = not self.flow.has_initial_connection or not self.flow.receivers
        self.closed_at_ns = now_ns
        self.heartbeat_deadline_ns = now_ns  # EOS goes out as soon as the log is drained
        self._fire(PublicationEvent.CLOSE)
        self.publisher_limit = self.appender.position
        self.kick()

    # ------------------------------------------------------------------ sender side

    def on_status_message(self, sm: StatusMessage, source: Address, now_ns: int) -> bool:
        """Flow control, connection tracking, SETUP requests and (MDC dynamic) destinations.

        True when :meth:`send` has something to do now because of it: data the new limit lets
        go, a SETUP it asked for, a first connection, a reply queued, a closing publication
        (its receivers' EOS ends the drain or the linger). Otherwise the sender need not step
        it before its deadline: most SMs only repeat a position (issue 31: a step per SM was a
        third of a server's sender steps)."""
        return self.on_sm(
            sm.flags,
            sm.session_id,
            sm.consumption_term_id,
            sm.consumption_term_offset,
            sm.receiver_window,
            sm.receiver_id,
            sm.group_tag,
            source,
            now_ns,
        )

    def _wants_send(self, connected: bool, flags: int) -> bool:
        """:meth:`on_sm`'s answer (see :meth:`on_status_message`); ``connected``: before it."""
        return (
            not connected
            or self.phase is not _ACTIVE
            or flags & _SM_SEND_SETUP != 0
            or bool(self.pending)
            or self.has_data_to_send()
        )

    def on_sm(
        self,
        flags: int,
        session_id: int,
        term_id: int,
        term_offset: int,
        receiver_window: int,
        receiver_id: int,
        group_tag: int | None,
        source: Address,
        now_ns: int,
    ) -> bool:
        """:meth:`on_status_message` with the SM's fields, as the sender reads them from the
        datagram (no frame object: an idle stream's SM is most of what a sender handles, and
        its path is kept to a few Python calls; issue 31)."""
        flow = self.flow
        connected = flow.has_initial_connection
        # ``self.status_messages_received += 1`` as tally.py's descriptor counts it, without
        # its Python call (an idle stream's every SM; issue 31)
        own = self.__dict__
        own["status_messages_received"] += 1
        tally = own.get("tally")
        if tally is not None:
            tally.values["status_messages_received"] += 1
        dests = self.dests
        dest: Destination | None
        if self.dynamic:
            dest = dests.by_address.get(source)
            if dest is None:
                if flags & _SM_EOS:
                    return self._wants_send(connected, flags)
                if not dests.may_add(source, session_id):
                    if flags & _SM_SEND_SETUP and dests.refused_only_for_host(source, session_id):
                        # refused only for its host, perhaps an honest client's allowed a moment
                        # later (a handshake client asks before its HELLO arrives): held, and
                        # refused if its host is not allowed in time (Destinations.answer_refused)
                        dests.hold_refused(source, session_id, now_ns)
                    else:
                        dests.status_messages_refused += 1
                    return self._wants_send(connected, flags)
                dest = dests.add(source, now_ns, self.window)
            elif dests.allowed_hosts is not None and host_of(source) not in dests.allowed_hosts:
                # (Destinations.is_allowed) no longer allowed (its handshake ended)
                self._drop_destination(source)
                dests.status_messages_refused += 1
                return self._wants_send(connected, flags)
            dest.last_seen_ns = now_ns
        else:
            dest = None
        if flags & _SM_SEND_SETUP:
            if not self.is_eos_sent and self.phase is _ACTIVE:
                self.setup_deadline_ns = now_ns
                if dest is not None:
                    dest.needs_setup = True
                else:
                    for d in dests.by_address.values():
                        d.needs_setup = True
            return True
        if session_id != self.session_id:
            return self._wants_send(connected, flags)
        if flags & _SM_EOS:
            if dest is not None and receiver_id not in dest.receiver_ids:
                # another destination's receiver (forged): it would stop holding the sender
                dests.status_messages_refused += 1
                return self._wants_send(connected, flags)
            self._receiver_positions.pop(receiver_id, None)
            flow.on_end_of_stream(receiver_id)
            if dest is not None:
                dests.remove_receiver(dest, receiver_id)
            self._update_publisher_limit()
            self._receiver_lost()
            return self._wants_send(connected, flags)
        # compute_position, inline: wrap_int32(term_id - initial_term_id) << shift + offset
        relative = (term_id - self.initial_term_id) & 0xFFFF_FFFF
        if relative & 0x8000_0000:
            relative -= 0x1_0000_0000
        position = (relative << self.shift) + term_offset
        if not 0 <= position <= self.sender_position or (
            dest is not None
            and receiver_id not in dest.receiver_ids  # admits_receiver's first answer
            and not dests.admits_receiver(dest, receiver_id, flow.receivers)
        ):
            # a receiver cannot have consumed what was never sent, and a receiver id is bound
            # to the address it was first heard from: either would move the sender limit past
            # a live slow receiver (fc=min/tagged), the limit never going back; an address
            # has a few receiver ids at most
            dests.status_messages_refused += 1
            return self._wants_send(connected, flags)
        if dest is not None:
            dest.receiver_ids.add(receiver_id)
            dest.needs_setup = False
            if receiver_window > 0:
                dest.window = receiver_window
        elif not self.dynamic:
            for d in dests.by_address.values():
                d.needs_setup = False
        positions = self._receiver_positions
        if position > positions.get(receiver_id, -1):
            positions[receiver_id] = position
        if type(flow) is FlowControl:
            # FlowControl.on_status_message, inline (``max``, every session's: an idle stream's
            # every SM comes here; one Python call fewer an SM, issue 31)
            flow.receivers[receiver_id] = now_ns
            flow.has_initial_connection = True
            if receiver_window > 0:
                flow.retransmit_window = receiver_window
            proposed = position + receiver_window
            if proposed > flow.sender_limit:
                flow.sender_limit = proposed
        else:
            flow.on_status_message(receiver_id, position, receiver_window, now_ns, group_tag)
        if (
            not flow.connected_by_any_sm
            or self.spies
            or self.sender_position + self.window > self.publisher_limit
        ):
            # (else connected, no spy: the limit it would set is the one it has)
            self._update_publisher_limit()
        if self.sender_position - self._released_to >= self._release_chunk:
            self._release_sent()  # what it consumed may now be given back (its first check)
        return (
            not connected
            or self.phase is not _ACTIVE
            or bool(self.pending)
            or (self.sender_position < self.appender.position and self.has_data_to_send())
        )

    def may_add_destination(self, source: Address, session_id: int) -> bool:
        """Whether an SM from ``source`` (for ``session_id``) may make it a destination."""
        return self.dests.may_add(source, session_id)

    def _drop_destination(self, address: Address) -> None:
        if self.dests.drop(address, self.flow.receivers):
            self.flow.refresh()
            self._update_publisher_limit()
            self._receiver_lost()

    def _receiver_lost(self) -> None:
        if self.on_receiver_lost is not None:
            self.on_receiver_lost()

    def on_nak(self, nak: NakFrame, now_ns: int, source: Address | None = None) -> int:
        """Resend exactly the original bytes of a lost range; returns datagrams queued.

        A dynamic publication takes NAKs only from its destinations (others are counted in
        ``naks_refused``) and resends only to the one that asked, within the rules of
        :class:`.RetransmitHandler` (linger, one receiver window of lingering bytes).
        """
        dest: Destination | None = None
        if self.dynamic:
            dest = self.dests.by_address.get(source) if source is not None else None
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
        low = max(low, self._released_to)  # given back: nothing to resend
        if start < low or start >= self.sender_position:
            return 0
        end = start + min(nak.length, self.term_length - term_offset, self.sender_position - start)
        if dest is not None:
            to, window = dest.address, dest.window
        else:
            to, window = None, self.flow.retransmit_window
        return self.retransmit.on_nak(start, end, to, window, self.mtu, now_ns, self._resend)

    def _resend(self, start: int, end: int, to: Address | None = None) -> tuple[int, int]:
        """Queue the datagrams of whole frames in ``[start, end)`` (one term's; to ``to``, else
        to every destination) in runs, as fresh data goes (:func:`.segment_runs`): (datagrams,
        bytes covered). A run is a copy of the log's bytes, sent on the next :meth:`send`."""
        targets = [to] if to is not None else [d.address for d in self.dests.by_address.values()]
        term_length = self.term_length
        spans: list[tuple[int, int]] = []
        covered = 0
        for partition, offset, to_send, advance in datagrams(
            self.terms, term_length, self.shift, start, end, self.mtu, end - start
        ):
            spans.append((partition * term_length + offset, to_send))
            self.retransmitted_bytes += to_send
            covered += advance
        self.retransmits_sent += len(spans)
        log = self.log_view
        pending = self.pending
        for run_start, run_end, segment in segment_runs(spans):
            data = bytes(log[run_start:run_end])
            for address in targets:
                pending.append((data, segment, address))
        return len(spans), covered

    def on_rttm(self, rttm: RttMeasurement, source: Address) -> None:
        if rttm.flags & RTTM_REPLY_FLAG:
            self.pending.append((rttm_reply(rttm, self.session_id, self.stream_id), 0, source))

    def _release_term(self, term_id: int, partition: int) -> None:
        """The appender entered ``partition`` (its thread): cleaned, its pages given back. What
        it held (three terms back) is past any NAK's reach and any spy's position, as when the
        appender zeroed it."""
        length = self.term_length
        release_range(self.log, partition * length, (partition + 1) * length)

    def _release_sent(self) -> None:
        """Give back the pages of what was sent and can no longer be asked for again, a chunk
        at a time (the sender's thread, where NAKs are answered): below every known receiver's
        consumption position (it NAKs only what it has not rebuilt, past it; a new receiver
        joins at the sender's position), and in any case below half a term and a message behind
        the sender (a NAK further back is ignored); below every spy's position. A NAK for what
        was given back is ignored. Never a partition the appender may be writing (three terms
        before the publisher limit)."""
        sender = self.sender_position
        if sender - self._released_to < self._release_chunk:
            return  # nothing to give back can reach a chunk (it is below the sender)
        reach = sender - self.term_length // 2 - self.max_message_length
        bound = reach
        positions = self._receiver_positions
        if positions:
            for rid in [r for r, p in positions.items() if p <= reach]:
                del positions[rid]  # a NAK from it could not reach what it has not rebuilt
            if positions:
                bound = max(reach, min(sender, *positions.values()))
        for spy in self.spies:
            bound = min(bound, spy.subscriber_position)
        if bound - self._released_to < self._release_chunk:
            return
        low = max(self._released_to, self.publisher_limit - 2 * self.term_length)
        self.released_bytes += release_positions(self.log, low, bound, self.shift)
        self._released_to = bound & -mmap.PAGESIZE  # a page part sent: next time

    def _update_publisher_limit(self) -> None:
        if self.phase is not _ACTIVE:  # is_closed
            return
        if self.flow.is_connected:
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
        return setup_frame(
            self.sender_position,
            session_id=self.session_id,
            stream_id=self.stream_id,
            initial_term_id=self.initial_term_id,
            term_length=self.term_length,
            mtu=self.mtu,
        )

    def heartbeat_frame(self) -> bytes:
        position = self.sender_position
        eos = self.phase is not _ACTIVE and position >= self.appender.position  # is_closed
        # an idle stream repeats its heartbeat: kept, built again only when it changes
        key = (position, eos)
        if key != self._heartbeat_key:
            self._heartbeat = heartbeat_frame(
                position,
                eos,
                session_id=self.session_id,
                stream_id=self.stream_id,
                initial_term_id=self.initial_term_id,
                term_length=self.term_length,
            )
            self._heartbeat_key = key
        return self._heartbeat

    def has_data_to_send(self) -> bool:
        """True when :meth:`send` would send data now (used before a driver goes to sleep)."""
        position = self.sender_position
        sender_limit = self.flow.sender_limit
        if position < self.appender.position and position < sender_limit:
            term = self.terms[(position >> self.shift) % PARTITION_COUNT]
            offset = position & (self.term_length - 1)
            length = _i32_from(term, offset)[0]
            if length <= 0:
                return False  # a claim not yet committed
            if term[offset + 6] == FrameType.PAD:
                return True
            return (length + 31) & -32 <= sender_limit - position
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
            appender.pad_and_rotate()
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

    def send(
        self, now_ns: int, transmit: Transmit, transmit_segments: TransmitSegments | None = None
    ) -> int:
        """Send what is due: replies, SETUP, data up to the sender limit, heartbeats; work count.

        With ``transmit_segments`` the data's datagrams, fresh and resent, go out in runs
        (:func:`.segment_runs`: contiguous, of equal length but the last), one call per run and
        destination; the datagrams on the wire are the same."""
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
            for data, segment, address in pending:
                if segment == 0 or len(data) <= segment:
                    transmit(data, address)
                elif transmit_segments is not None:
                    transmit_segments(data, segment, address)
                else:
                    for at in range(0, len(data), segment):
                        transmit(data[at : at + segment], address)
            work += len(pending)
        dests = self.dests
        flow = self.flow
        if dests.refused_elicits and dests.refused_due(now_ns):
            if dests.answer_refused(now_ns, self.window):
                self.setup_deadline_ns = now_ns
        if self.dynamic and dests.by_address and dests.expire(now_ns, flow.receivers):
            flow.refresh()
            # their receivers went with them: the last one gone, offers answer NOT_CONNECTED
            self._update_publisher_limit()
            self._receiver_lost()
        if now_ns >= self.setup_deadline_ns and not self.is_eos_sent:
            connected = flow.has_initial_connection
            frame = None
            for dest in dests.by_address.values():
                if dest.needs_setup or not connected:
                    if frame is None:
                        frame = self.setup_frame()
                    transmit(frame, dest.address)
                    self.setups_sent += 1
            if frame is not None:
                work += 1
            self.setup_deadline_ns = now_ns + SETUP_INTERVAL_NS
        if flow.receivers and flow.expire(now_ns):
            self._update_publisher_limit()
            self._receiver_lost()
        if not flow.has_initial_connection:
            return work
        # (_send_data sends nothing with nothing appended past the sender: an idle stream)
        sent = (
            self._send_data(transmit, transmit_segments)
            if self.sender_position < self.appender.position
            else 0
        )
        if sent:
            if self.is_closed and self.sender_position >= self.appender.position:
                self.heartbeat_deadline_ns = now_ns  # drained: EOS on the next step
            else:
                self.heartbeat_deadline_ns = now_ns + HEARTBEAT_INTERVAL_NS
            work += sent
            self._update_publisher_limit()
        elif now_ns >= self.heartbeat_deadline_ns:
            # an active stream's kept heartbeat without heartbeat_frame()'s call (an idle
            # stream's every heartbeat; issue 31): its key as that method makes it
            frame = (
                self._heartbeat
                if self.phase is _ACTIVE and self._heartbeat_key == (self.sender_position, False)
                else self.heartbeat_frame()
            )
            for dest in dests.by_address.values():
                transmit(frame, dest.address)
            # ``self.heartbeats_sent += 1`` as tally.py's descriptor counts it, without its
            # Python call (an idle stream's every heartbeat; issue 31)
            own = self.__dict__
            own["heartbeats_sent"] += 1
            tally = own.get("tally")
            if tally is not None:
                tally.values["heartbeats_sent"] += 1
            closing = frame[5] & _DATA_EOS or self.phase is not _ACTIVE
            idle = self.idle_heartbeat_interval_ns
            if closing or idle <= HEARTBEAT_INTERVAL_NS:
                self.heartbeat_deadline_ns = now_ns + HEARTBEAT_INTERVAL_NS
            else:  # on the idle grid: an idle driver's heartbeats go out together
                # (rounded down to the grid: the interval is longer than it, so still after now)
                deadline = now_ns + idle
                self.heartbeat_deadline_ns = deadline - deadline % IDLE_GRID_NS
            if frame[5] & _DATA_EOS:
                self.is_eos_sent = True
                if self.phase is _DRAINING:
                    self.linger_deadline_ns = now_ns + self.linger_ns
                self._fire(PublicationEvent.EOS_SENT)
            work += 1
        if self.phase is _DRAINING and not flow.receivers:
            # Aeron's DRAINING with nobody connected: what no receiver will take cannot be
            # drained (flow control holds it back), so linger and free the log.
            self._fire(PublicationEvent.RECEIVERS_GONE)
            self.linger_deadline_ns = now_ns + self.linger_ns
        if self.phase is _LINGER:
            assert self.linger_deadline_ns is not None
            if now_ns >= self.linger_deadline_ns:
                self._fire(PublicationEvent.LINGER_EXPIRED)
            elif self.is_eos_sent and not flow.receivers:
                self._fire(PublicationEvent.EOS_ACKNOWLEDGED)
        return work

    def _send_data(self, transmit: Transmit, transmit_segments: TransmitSegments | None) -> int:
        position = self.sender_position
        limit = min(self.appender.position, self.flow.sender_limit)
        if position >= limit:
            return 0
        found = datagrams(
            self.terms,
            self.term_length,
            self.shift,
            position,
            limit,
            self.mtu,
            DATAGRAMS_PER_SEND,
        )
        addresses = [d.address for d in self.dests.by_address.values()]
        count = sent_bytes = 0
        if transmit_segments is None:
            terms = self.terms
            for partition, offset, to_send, advance in found:
                data = terms[partition][offset : offset + to_send]
                for address in addresses:
                    transmit(data, address)
                count += 1
                sent_bytes += to_send
                position += advance
        else:
            # the terms are one buffer in partition order: a run never wraps from the last
            # partition to the first (its offsets are not contiguous)
            term_length = self.term_length
            spans: list[tuple[int, int]] = []  # (offset in the log, length) of each datagram
            for partition, offset, to_send, advance in found:
                spans.append((partition * term_length + offset, to_send))
                sent_bytes += to_send
                position += advance
            count = len(spans)
            log = self.log_view
            for start, end, segment in segment_runs(spans):
                data = log[start:end]
                for address in addresses:
                    transmit_segments(data, segment, address)
        self.sender_position = position
        self.bytes_sent += sent_bytes * len(addresses)
        self._release_sent()
        return count

    @property
    def next_deadline_ns(self) -> int:
        """Earliest time :meth:`send` has something to do without new input."""
        flow = self.flow
        connected = flow.has_initial_connection
        phase = self.phase
        if connected:
            deadline = self.heartbeat_deadline_ns
            for d in self.dests.by_address.values():
                if d.needs_setup:
                    deadline = min(deadline, self.setup_deadline_ns)
                    break
        elif self.dests.by_address or phase is not _ACTIVE:
            deadline = self.setup_deadline_ns
        else:
            # no destination yet (a server's reply publication before its first client): a
            # SETUP has nowhere to go; a destination added or a receiver's SM kicks it
            deadline = NO_DEADLINE_NS
        if phase is _LINGER and self.linger_deadline_ns is not None:
            deadline = min(deadline, self.linger_deadline_ns)
        elif phase is _DRAINING and self._undrainable and self.closed_at_ns is not None:
            deadline = min(deadline, self.closed_at_ns)  # to be closed on the next send
        if self.dests.refused_elicits:
            refused = self.dests.next_refused_ns()
            if refused is not None and refused < deadline:
                deadline = refused  # a held SETUP request expires: counted refused
        return deadline


# what :attr:`PublicationState.next_deadline_ns` says when nothing is due without new input
NO_DEADLINE_NS = 2**62


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

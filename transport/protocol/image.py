"""Sans-I/O state of one image: a publisher's stream rebuilt on the receiving side.

Two threads touch an image: the **receiver** (:meth:`ImageState.on_data`, :meth:`do_work`,
stepped with ``now_ns``) and the **subscriber** (:meth:`poll`, :meth:`controlled_poll`,
:meth:`block_poll`). They share the term buffers and exchange exactly two integers:
``hwm``/``rebuild_position`` (receiver writes) and ``subscriber_position`` (subscriber writes).

Invariants:

* Created from a SETUP: term length, MTU and initial term id come from it; ``join_position`` is
  the SETUP's (active_term_id, term_offset) position and every position starts there.
* A datagram is copied whole into its term (``insert_packet``) only if it lies in
  ``[subscriber_position, last_sm_position + window]`` (the window our SMs advertise, at most half
  a term); otherwise it is an under-run or an over-run and is counted and dropped (Aeron's
  ``isFlowControlOverRun``). A heartbeat beyond that moves nothing either. So writes never reach
  a partition the subscriber has not finished with, and a sender can make us hold and scan at
  most one window of data ahead of the subscriber.
* The receiver zeroes the partition of a term once the subscriber is past it (before any SM
  that would let the sender write into it again).
* SMs: the first at once, then when ``subscriber_position > last_sm_position + window/4``, and
  every 200 ms (``SM_INTERVAL_NS``, Aeron's cadence) repeating the last position, idle or not;
  an image made with ``idle_sm_interval_ns`` (a channel's ``idle-sm-interval``: Aeron's
  driver-wide ``aeron.rcv.status.message.timeout``, per channel, our own sessions' channels)
  sends its SMs that far apart once connected (the one after its first SM still at 200 ms, in
  case the first was lost), at most ``SM_IDLE_INTERVAL_MAX_NS`` (a fifth of the sender's 5 s
  connection timeout), due on the idle grid (``schedule.IDLE_GRID_NS``: never later, at most
  20 ms sooner), data or not: as Aeron, only a quarter window consumed brings an SM sooner (an
  SM 200 ms after each message, as before, doubled the SMs of a session publishing once a
  second, each one a datagram out, one in and a sender step; issue 31). Gaps and
  their NAKs are the :class:`~.loss_detector.LossDetector`'s (its module states its rules).
* End of stream: an EOS heartbeat at position P; when everything up to P is rebuilt and
  consumed, SMs carry EOS and the image is done. No packet for ``liveness_timeout_ns``: done too.

Lifecycle (:data:`IMAGE_TRANSITIONS`; every change of :attr:`ImageState.phase` goes through it,
an event it does not list raises :class:`LocalProtocolError`)::

    INIT --connect--> ACTIVE                       (the first SM went out: the sender may send)
    INIT, ACTIVE --close--> DRAINING               (the subscription let go of it)
    INIT, ACTIVE --end_of_stream--> DRAINING       (everything up to the EOS rebuilt and consumed)
    INIT, ACTIVE --timeout--> DRAINING             (no packet for ``liveness_timeout_ns``)
    DRAINING --eos_sms_sent--> CLOSED              (EOS_SM_COUNT EOS SMs, spaced out)
    any but CLOSED --source_closed--> CLOSED       (a spy whose publication is gone: no SMs)
    DRAINING, CLOSED --close, end_of_stream, timeout--> itself

The receiver thread makes every transition (:meth:`ImageState.do_work`); the subscription's
thread only asks, with :meth:`ImageState.request_close`, which the next step turns into ``close``.
CLOSED is terminal: a closed image sends nothing and its dispatcher removes it (``is_done``).
"""

from __future__ import annotations

import enum
import mmap
import random
import struct
from bisect import insort
from collections import deque
from collections.abc import Callable
from typing import Any

from aeron_spark.transport.api import BlockHandler, ControlledAction, ControlledFragmentHandler
from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER_LENGTH,
    DATA_HEADER_TAIL,
    FRAME_ALIGNMENT,
    NAK,
    NAK_LENGTH,
    SM,
    SM_GROUP_TAG,
    SM_LENGTH,
    SM_WITH_GROUP_TAG_LENGTH,
    DataFlags,
    FrameType,
    SmFlags,
)
from aeron_spark.transport.protocol.lifecycle import step
from aeron_spark.transport.protocol.logbuffer import (
    PARTITION_COUNT,
    allocate_log,
    compute_position,
    position_bits_to_shift,
    receiver_window_length,
    release_chunk,
    release_positions,
    release_range,
    wrap_int32,
)
from aeron_spark.transport.protocol.loss_detector import (
    MAX_GAPS,
    MAX_NAK_RETRY_NS,
    MIN_NAK_RETRY_NS,
    NAK_BACKOFF_MAX_SHIFT,
    NAK_RETRY_RATIO,
    LossDetector,
)
from aeron_spark.transport.protocol.schedule import IDLE_GRID_NS
from aeron_spark.transport.protocol.tally import counter
from aeron_spark.transport.protocol.term import (
    FragmentHandler,
    Header,
    insert_packet,
    read_term,
    zero_fill,
)

__all__ = [
    "EOS_SM_COUNT",
    "IMAGE_LIVENESS_TIMEOUT_NS",
    "IMAGE_TRANSITIONS",
    "MAX_GAPS",
    "MAX_NAK_RETRY_NS",
    "MIN_NAK_RETRY_NS",
    "NAK_BACKOFF_MAX_SHIFT",
    "NAK_RETRY_RATIO",
    "SM_IDLE_INTERVAL_MAX_NS",
    "SM_INTERVAL_NS",
    "ImageEvent",
    "ImagePhase",
    "ImageState",
    "system_random",
]

SM_INTERVAL_NS = 200_000_000
SM_IDLE_INTERVAL_MAX_NS = 1_000_000_000
IMAGE_LIVENESS_TIMEOUT_NS = 10_000_000_000
EOS_SM_COUNT = 3

# The default source of receiver ids: the system's (an id a stranger cannot predict from
# earlier ones, as Mersenne Twister's outputs can be). Tests pass a seeded random.Random.
system_random: random.Random = random.SystemRandom()

_I32 = struct.Struct("<i")
_i32_from = _I32.unpack_from
_TYPE_PAD = int(FrameType.PAD)
_FLAG_EOS = int(DataFlags.EOS)

Address = Any
Transmit = Callable[[Any, Address], None]


class ImagePhase(enum.Enum):
    INIT = "init"
    ACTIVE = "active"
    DRAINING = "draining"
    CLOSED = "closed"


class ImageEvent(enum.Enum):
    CONNECT = "connect"
    CLOSE = "close"
    END_OF_STREAM = "end_of_stream"
    TIMEOUT = "timeout"
    EOS_SMS_SENT = "eos_sms_sent"
    SOURCE_CLOSED = "source_closed"


_I = ImagePhase
_IE = ImageEvent
IMAGE_TRANSITIONS: dict[tuple[ImagePhase, ImageEvent], ImagePhase] = {
    (_I.INIT, _IE.CONNECT): _I.ACTIVE,
    (_I.DRAINING, _IE.EOS_SMS_SENT): _I.CLOSED,
}
for _phase in (_I.INIT, _I.ACTIVE):
    for _event in (_IE.CLOSE, _IE.END_OF_STREAM, _IE.TIMEOUT):
        IMAGE_TRANSITIONS[(_phase, _event)] = _I.DRAINING
for _phase in (_I.DRAINING, _I.CLOSED):
    for _event in (_IE.CLOSE, _IE.END_OF_STREAM, _IE.TIMEOUT):
        IMAGE_TRANSITIONS[(_phase, _event)] = _phase
for _phase in (_I.INIT, _I.ACTIVE, _I.DRAINING):
    IMAGE_TRANSITIONS[(_phase, _IE.SOURCE_CLOSED)] = _I.CLOSED
IMAGE_TRANSITIONS[(_I.CLOSED, _IE.SOURCE_CLOSED)] = _I.CLOSED
_INIT = _I.INIT
_DRAINING = _I.DRAINING
_CLOSED = _I.CLOSED


class ImageState:
    """Receiver and subscriber state of one (session, stream) image."""

    # its counters' keys in a driver's positions snapshot, made by the first snapshot
    position_keys: tuple[str, ...] = ()
    # what it counts, also added to its dispatcher's running totals (tally.py: no walk)
    naks_sent: int = counter()
    status_messages_sent: int = counter()
    over_runs: int = counter("flow_control_over_runs")
    under_runs: int = counter("flow_control_under_runs")
    gaps_filled: int = counter()

    def __init__(
        self,
        *,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        active_term_id: int,
        term_offset: int,
        term_length: int,
        mtu: int,
        source_address: Address,
        control_address: Address | None = None,
        receiver_window: int = 128 * 1024,
        nak_delay_ns: int = 100_000,
        reliable: bool = True,
        liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS,
        idle_sm_interval_ns: int = 0,
        receiver_id: int | None = None,
        now_ns: int = 0,
        log: bytearray | mmap.mmap | None = None,
        group_tag: int | None = None,
        rng: random.Random = system_random,
    ) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.term_mask = term_length - 1
        self.mtu = mtu
        self.shift = position_bits_to_shift(term_length)
        self.source_address = source_address
        self.sm_address = control_address if control_address is not None else source_address
        host, port = source_address[0], source_address[1]
        self.source_identity = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        # the subscriber's word that this sender proved itself (a handshake server: a valid
        # HELLO); an image at a full limit that never got it is evicted first (issue 28 item 5)
        self.vouched = False
        self.window = receiver_window_length(term_length, receiver_window)
        self.nak_delay_ns = nak_delay_ns
        self.reliable = reliable
        self.liveness_timeout_ns = liveness_timeout_ns
        # the SM timeout once connected (0: Aeron's 200 ms; a channel's ``idle-sm-interval``)
        self.idle_sm_interval_ns = idle_sm_interval_ns or SM_INTERVAL_NS
        self.receiver_id = receiver_id if receiver_id is not None else rng.getrandbits(63)
        # its own log (not a spy's view of a publication's): consumed pages are given back
        self._own_log: mmap.mmap | None = None
        if log is None:
            log = self._own_log = allocate_log(PARTITION_COUNT * term_length)
        self.log = log
        view = memoryview(self.log)
        self.terms = [view[i * term_length : (i + 1) * term_length] for i in range(PARTITION_COUNT)]
        join = compute_position(active_term_id, term_offset, self.shift, initial_term_id)
        self.join_position = join
        self.hwm = join
        self.rebuild_position = join
        self.subscriber_position = join
        self.last_sm_position = join
        self.sm_deadline_ns = now_ns  # first SM at once
        self.sm_scheduled = True
        self.cleaned_term_count = (join >> self.shift) - 1
        self._released_to = join  # pages below it (rounded) were given back
        self._release_chunk = release_chunk(term_length)
        self.released_bytes = 0  # consumed bytes whose pages were given back
        self.last_packet_ns = now_ns
        self.loss = LossDetector(self.terms, term_length, join, nak_delay_ns)
        self._dirty = False  # something was inserted since the last gap scan
        self.eos_position: int | None = None
        self.eos_sms_left = EOS_SM_COUNT
        self.phase = ImagePhase.INIT  # changed only by _fire (IMAGE_TRANSITIONS)
        self.close_requested = False  # the subscription let go (any thread; do_work acts on it)
        self.transitions = 0  # phase changes so far (a closed image made at most 3)
        self.header = Header(initial_term_id, self.shift)
        # counters
        self.naks_sent = 0
        self.status_messages_sent = 0
        self.heartbeats_received = 0
        self.bytes_received = 0
        self.over_runs = 0
        self.under_runs = 0
        self.gaps_filled = 0
        # a subscription's gtag: every SM carries it (an fc=tagged publisher counts us by it)
        self.group_tag = group_tag
        self._sm_length = SM_LENGTH if group_tag is None else SM_WITH_GROUP_TAG_LENGTH
        self._sm_buffer = bytearray(self._sm_length)
        self._sm_key: tuple[int, int, int] | None = None  # what _sm_bytes says
        self._sm_bytes = b""
        if group_tag is not None:
            SM_GROUP_TAG.pack_into(self._sm_buffer, SM_LENGTH, group_tag)
        # Where kick() puts it for the receiver (its dispatcher's ready queue; None: nobody
        # steps it), and whether it is there already (cleared before the receiver steps it).
        self.wakeups: deque[Any] | None = None
        self.kicked = False
        self._nak_buffer = bytearray(NAK_LENGTH)

    # ------------------------------------------------------------------ the loss detector's

    @property
    def gaps(self) -> dict[int, list[int]]:
        """Gap position -> [length, next NAK time, NAKs sent, time of the last NAK]."""
        return self.loss.gaps

    @property
    def gap_position(self) -> int:
        """The first gap's position; -1 when none."""
        return self.loss.gap_position

    @property
    def gap_length(self) -> int:
        return self.loss.gap_length

    @property
    def nak_rtt_ns(self) -> int:
        return self.loss.nak_rtt_ns

    @property
    def nak_retry_ns(self) -> int:
        return self.loss.nak_retry_ns

    @property
    def _inserted(self) -> list[int]:
        return self.loss.inserted

    # ------------------------------------------------------------------ lifecycle

    def _fire(self, event: ImageEvent) -> None:
        phase = step(IMAGE_TRANSITIONS, self.phase, event, "image")
        if phase is not self.phase:
            self.phase = phase
            self.transitions += 1

    def vouch(self, vouched: bool = True) -> None:
        """The subscriber trusts this sender: the image is never evicted for a newcomer (or,
        with ``False``, no longer does: it may be again)."""
        self.vouched = vouched

    def kick(self) -> None:
        """Something for the receiver that no deadline says (data arrived, the subscriber moved
        on, a close): queue it to be stepped (any thread; at most once until it is stepped)."""
        wakeups = self.wakeups
        if wakeups is not None and not self.kicked:
            self.kicked = True
            wakeups.append(self)

    def request_close(self) -> None:
        """The subscription is done with it: EOS SMs go out from the next :meth:`do_work`."""
        self.close_requested = True
        self.kick()

    @property
    def is_closing(self) -> bool:
        """Close requested, or DRAINING (sending its EOS SMs)."""
        return self.close_requested or self.phase is _DRAINING

    @is_closing.setter
    def is_closing(self, value: bool) -> None:
        """``image.is_closing = True`` is :meth:`request_close`; a close cannot be taken back."""
        if not value:
            raise LocalProtocolError("image: a requested close cannot be taken back")
        self.request_close()

    @property
    def is_done(self) -> bool:
        """CLOSED: the receiver finished with it; remove it and report it unavailable."""
        return self.phase is _CLOSED

    def on_source_closed(self) -> None:
        """The in-process publication it reads (a spy's) is gone: CLOSED without any SM."""
        self._fire(ImageEvent.SOURCE_CLOSED)

    # ------------------------------------------------------------------ receiver side

    def on_data(
        self,
        packet: Any,
        length: int,
        term_id: int,
        term_offset: int,
        now_ns: int,
        extent: int | None = None,
    ) -> bool:
        """A datagram of DATA/PAD frames (already validated) or a heartbeat; True if inserted.

        ``extent`` is how far the datagram reaches in the term (past ``length`` when it ends with
        a PAD frame); an in-order datagram moves ``rebuild_position`` at once, anything else is
        left to the next gap scan.
        """
        self.last_packet_ns = now_ns
        relative = (term_id - self.initial_term_id) & 0xFFFF_FFFF  # wrap_int32, inline
        if relative & 0x8000_0000:
            self.under_runs += 1
            return False
        position = (relative << self.shift) + term_offset
        if _i32_from(packet, 0)[0] == 0:  # heartbeat
            self.heartbeats_received += 1
            if position > self.last_sm_position + self.window:
                self.over_runs += 1
                return False
            if position > self.hwm:
                self.hwm = position
                self._dirty = True  # data up to here may be missing: scan for gaps
            if packet[5] & _FLAG_EOS and position >= self.rebuild_position:
                self.eos_position = position
            return False
        end = position + length
        if end <= self.subscriber_position:
            self.under_runs += 1
            return False
        if end > self.last_sm_position + self.window:  # past what our last SM allowed
            self.over_runs += 1
            return False
        term = self.terms[relative % PARTITION_COUNT]
        fresh = _i32_from(term, term_offset)[0] == 0  # else a duplicate: nothing is written
        insert_packet(term, term_offset, packet if len(packet) == length else packet[:length])
        self.bytes_received += length
        if position == self.rebuild_position and position >= self.hwm and not self._dirty:
            end = position + (length if extent is None else extent)
            self.rebuild_position = end
        else:
            self._dirty = True
            if fresh:
                insort(self.loss.inserted, position)
        if end > self.hwm:
            self.hwm = end
        return True

    def _clean(self) -> None:
        """Clean the terms behind the subscriber. An image with a log of its own gives the pages
        of what was consumed back to the kernel, a chunk at a time (they read as zeros after, as
        a cleaned term does): its memory is what it holds, not every page it ever wrote. Never
        below the previous term's start: a partition ahead (an insert within the window) is
        never touched (on the receiver's thread, as inserts are)."""
        sub = self.subscriber_position
        current = sub >> self.shift
        own = self._own_log
        while self.cleaned_term_count < current - 1:
            self.cleaned_term_count += 1
            partition = self.cleaned_term_count % PARTITION_COUNT
            if own is not None:
                length = self.term_length
                release_range(own, partition * length, (partition + 1) * length)
            else:
                zero_fill(self.terms[partition])
        if own is not None and sub - self._released_to >= self._release_chunk:
            low = max(self._released_to, (current - 1) << self.shift)
            self.released_bytes += release_positions(own, low, sub, self.shift)
            self._released_to = sub & -mmap.PAGESIZE  # a page part consumed: next time

    def do_work(self, now_ns: int, transmit: Transmit) -> int:
        """Clean consumed terms, NAK gaps, send SMs, check liveness and EOS; work count."""
        phase = self.phase
        if phase is _CLOSED:
            return 0
        if phase is _DRAINING and now_ns < self.sm_deadline_ns and self.eos_sms_left < EOS_SM_COUNT:
            # between its spaced-out EOS SMs a draining image has nothing to do: nobody reads
            # it any more, so no term to clean and no gap worth a NAK (a server's port holds
            # many of these for a while after each session)
            return 0
        work = 0
        if self.subscriber_position > self.rebuild_position:
            self.rebuild_position = self.subscriber_position  # consumed frames were complete
            self._dirty = True
        sub = self.subscriber_position
        if self.cleaned_term_count < (sub >> self.shift) - 1 or (
            self._own_log is not None and sub - self._released_to >= self._release_chunk
        ):
            self._clean()  # (its own checks, first: an idle image has nothing to clean)
        loss = self.loss
        if self.hwm > self.rebuild_position:
            if self._dirty:
                self._dirty = False
                self.rebuild_position = loss.scan(self.rebuild_position, self.hwm, now_ns)
        elif loss.gaps:
            loss.clear()
        if loss.gaps:
            for gap_position, entry in loss.due(now_ns):
                work += self._on_nak_due(gap_position, entry, now_ns, transmit)
        sub = self.subscriber_position
        if phase is not _DRAINING:
            eos = self.eos_position
            if self.close_requested:
                self._fire(ImageEvent.CLOSE)
            elif eos is not None and self.rebuild_position >= eos and sub >= eos:
                self._fire(ImageEvent.END_OF_STREAM)
            elif now_ns - self.last_packet_ns > self.liveness_timeout_ns:
                self._fire(ImageEvent.TIMEOUT)
            phase = self.phase
        if phase is _DRAINING:
            # a close before the first SM left that SM scheduled: EOS SMs replace it (else
            # needs_work() stayed true and the receiver stepped without sleeping until the end)
            self.sm_scheduled = False
            if now_ns < self.sm_deadline_ns and self.eos_sms_left < EOS_SM_COUNT:
                return work  # EOS SMs are spaced out, so a short loss burst cannot eat them all
            self._send_sm(sub, SmFlags.EOS, transmit)
            self.eos_sms_left -= 1
            if self.eos_sms_left <= 0:
                self._fire(ImageEvent.EOS_SMS_SENT)
            self.sm_deadline_ns = now_ns + SM_INTERVAL_NS // 4
            return work + 1
        if sub - self.last_sm_position > self.window >> 2:
            self.last_sm_position = sub
            self.sm_scheduled = True
        if self.sm_scheduled or now_ns >= self.sm_deadline_ns:
            position = self.last_sm_position
            if (position, 0, self.window) == self._sm_key:
                # _send_sm's repeat of the kept SM, inline (an idle image's every SM: a Python
                # call a datagram less; issue 31)
                transmit(self._sm_bytes, self.sm_address)
                own = self.__dict__
                own["status_messages_sent"] += 1
                tally = own.get("tally")
                if tally is not None:
                    tally.values["status_messages_sent"] += 1
            else:
                self._send_sm(position, 0, transmit)
            self.sm_scheduled = False
            if phase is not _INIT and self.idle_sm_interval_ns > SM_INTERVAL_NS:
                # the channel's SM timeout, on the idle grid: an idle driver's SMs go out
                # together (data arriving does not bring an SM sooner: a quarter window
                # consumed does, above)
                # (rounded down to the grid: the interval is longer than it, so still after now)
                deadline = now_ns + self.idle_sm_interval_ns
                self.sm_deadline_ns = deadline - deadline % IDLE_GRID_NS
            else:
                self.sm_deadline_ns = now_ns + SM_INTERVAL_NS
            if phase is _INIT:
                self._fire(ImageEvent.CONNECT)
            work += 1
        return work

    def _on_nak_due(self, position: int, entry: list[int], now_ns: int, transmit: Transmit) -> int:
        offset = position & self.term_mask
        length = entry[0]
        if not self.reliable:
            term = self.terms[(position >> self.shift) % PARTITION_COUNT]
            # Fill the gap with padding so the subscriber moves past it (reliable=false).
            DATA_HEADER_TAIL.pack_into(
                term,
                offset + 4,
                0,
                DataFlags.UNFRAGMENTED,
                _TYPE_PAD,
                offset,
                self.session_id,
                self.stream_id,
                wrap_int32(self.initial_term_id + (position >> self.shift)),
                0,
            )
            _I32.pack_into(term, offset, length)
            self.gaps_filled += 1
            self.loss.filled(position)
            self._dirty = True
            return 1
        NAK.pack_into(
            self._nak_buffer,
            0,
            NAK_LENGTH,
            0,
            0,
            FrameType.NAK,
            self.session_id,
            self.stream_id,
            wrap_int32(self.initial_term_id + (position >> self.shift)),
            offset,
            length,
        )
        transmit(bytes(self._nak_buffer), self.sm_address)
        self.naks_sent += 1
        self.loss.on_nak_sent(entry, now_ns)
        return 1

    def _send_sm(self, position: int, flags: int, transmit: Transmit) -> None:
        # an idle image repeats its last SM: its bytes are kept, packed again only on a change
        key = (position, flags, self.window)
        if key != self._sm_key:
            SM.pack_into(
                self._sm_buffer,
                0,
                self._sm_length,
                0,
                flags,
                FrameType.SM,
                self.session_id,
                self.stream_id,
                wrap_int32(self.initial_term_id + (position >> self.shift)),
                position & self.term_mask,
                self.window,
                self.receiver_id,
            )
            self._sm_bytes = bytes(self._sm_buffer)
            self._sm_key = key
        transmit(self._sm_bytes, self.sm_address)
        # ``self.status_messages_sent += 1`` as tally.py's descriptor counts it, without its
        # Python call (an idle image's every SM; issue 31)
        own = self.__dict__
        own["status_messages_sent"] += 1
        tally = own.get("tally")
        if tally is not None:
            tally.values["status_messages_sent"] += 1

    @property
    def next_deadline_ns(self) -> int:
        if self.phase is _DRAINING:
            # its spaced-out EOS SMs only: a timed-out image's liveness deadline is behind it
            # (it was due at once, again and again, until its EOS SMs were sent: a spin)
            return self.sm_deadline_ns
        deadline = self.sm_deadline_ns
        loss = self.loss
        if loss.gaps:
            deadline = loss.next_deadline_ns(deadline)
        liveness = self.last_packet_ns + self.liveness_timeout_ns + 1
        return deadline if deadline < liveness else liveness

    def needs_work(self) -> bool:
        """True when :meth:`do_work` has something to do right now (before a driver sleeps)."""
        phase = self.phase
        if phase is _DRAINING or phase is _CLOSED:
            return False  # its EOS SMs go out at sm_deadline_ns (next_deadline_ns)
        return (
            self.sm_scheduled
            or self.subscriber_position - self.last_sm_position > self.window >> 2
            or self._dirty
            and self.hwm > self.rebuild_position
        )

    # ------------------------------------------------------------------ subscriber side

    def _consumed(self) -> None:
        """After a poll: a status message is due once a quarter window was consumed since the
        last one, so the receiver is kicked to send it. (The IPC image log borrows the polls and
        has its own, with no receiver to kick.)"""
        if self.subscriber_position - self.last_sm_position > self.window >> 2:
            self.kick()

    @property
    def is_end_of_stream(self) -> bool:
        eos = self.eos_position
        return eos is not None and self.subscriber_position >= eos

    def has_data(self) -> bool:
        position = self.subscriber_position
        term = self.terms[(position >> self.shift) % PARTITION_COUNT]
        return _i32_from(term, position & self.term_mask)[0] != 0

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Deliver up to ``fragment_limit`` complete fragments in order; returns how many."""
        total = 0
        header = self.header
        term_length = self.term_length
        while total < fragment_limit:
            position = self.subscriber_position
            offset = position & self.term_mask
            term = self.terms[(position >> self.shift) % PARTITION_COUNT]
            fragments, new_offset = read_term(term, offset, handler, fragment_limit - total, header)
            total += fragments
            if new_offset == offset:
                break
            self.subscriber_position = position + (new_offset - offset)
            if new_offset < term_length:
                break
        self._consumed()
        return total

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        """Like :meth:`poll`; the handler's :class:`ControlledAction` says whether to go on."""
        fragments = 0
        header = self.header
        position = self.subscriber_position
        while fragments < fragment_limit:
            offset = position & self.term_mask
            term = self.terms[(position >> self.shift) % PARTITION_COUNT]
            length = _i32_from(term, offset)[0]
            if length <= 0:
                break
            aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if term[offset + 6] == _TYPE_PAD:
                position += aligned
                self.subscriber_position = position
                continue
            header.buffer = term
            header.offset = offset
            action = handler(term[offset + DATA_HEADER_LENGTH : offset + length], header)
            if action == ControlledAction.ABORT:
                break
            fragments += 1
            position += aligned
            self.subscriber_position = position
            if action == ControlledAction.BREAK:
                break
        self._consumed()
        return fragments

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        """Hand one run of complete raw frames (within one term) to ``handler``; bytes consumed."""
        position = self.subscriber_position
        offset = position & self.term_mask
        term = self.terms[(position >> self.shift) % PARTITION_COUNT]
        limit = min(self.term_length, offset + block_length_limit)
        end = offset
        while end < limit:
            length = _i32_from(term, end)[0]
            if length <= 0:
                break
            aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            if term[end + 6] == _TYPE_PAD:
                if end == offset:
                    end += aligned
                break
            if end + aligned > limit:
                break
            end += aligned
        if end == offset:
            return 0
        term_id = wrap_int32(self.initial_term_id + (position >> self.shift))
        handler(term, offset, end - offset, self.session_id, term_id)
        self.subscriber_position = position + (end - offset)
        self._consumed()
        return end - offset

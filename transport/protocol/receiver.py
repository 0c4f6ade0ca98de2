"""Sans-I/O receive side of one UDP endpoint: datagram dispatch to images (Aeron's dispatcher).

:class:`ReceiveDispatcher` takes every datagram that arrives on one receive socket
(``on_datagram(buffer, length, source, now_ns, transmit)``) and

* validates it (any malformed datagram raises :class:`InvalidFrameError`, which the driver counts
  as an invalid frame, and changes nothing);
* for a SETUP of a stream someone subscribes to, creates an :class:`ImageState` per interested
  subscription at the SETUP's position (unless the session is filtered out or cooling down);
  a SETUP whose term length or mtu is above the subscription's bound (``max_term_length``,
  ``max_mtu``) creates nothing and is counted (``setups_rejected``), as is one past the
  subscription's image limits (``max_images`` in all, ``max_images_per_source`` from one sender's
  address and port, ``max_images_per_address`` from one IP address, an IPv6 sender's /64 counted
  as one: ``images_refused``) or
  past its rate of new images per /24 (IPv4) or /64 (IPv6) network of senders
  (``setups_per_prefix_per_s``, a token bucket with as big a burst: ``setups_rate_limited``);
  a SETUP from a host the subscription does not admit (``admit_source``) makes no image either
  (``setups_source_refused``), and that host's DATA elicits no SETUP;
* for DATA of a known session from the source of its SETUP (address and port), copies the
  datagram into the image (from any other source it is dropped: ``data_wrong_source``); for
  DATA of an unknown session (not EOS, not cooling down) answers an SM with SEND_SETUP to the
  sender, at most every 100 ms;
* ignores control frames meant for publications.

A subscription's ``on_data`` (which wakes a thread waiting for data) is called once per step,
at the start of :meth:`do_work`, for every interest that got data since the last one, not once
per datagram: the receiver drains a burst of datagrams before the subscriber runs. Woken per
datagram, a subscriber thread took the GIL from the receiver at every ``recvfrom`` (a bounded
replay from the real archive spent ~160 us per receive and the subscriber mostly waited).
Every advance of what a subscriber can read calls it: data inserted, and a gap an unreliable
image pads (in the step that pads it, nothing having arrived).

:meth:`do_work` steps the images that are due (SMs, NAKs, cleaning, liveness): kicked (data
arrived, the subscriber moved on, a close) or at their next deadline (:class:`~.schedule.
DueQueue`), so an idle image costs nothing between its deadlines; and, for subscriptions with a
``control`` address (multi-destination-cast), sends SETUP-eliciting SMs from this socket to it
when their elicit deadline comes.
"""

from __future__ import annotations

import functools
import ipaddress
import random
import struct
import threading
from collections.abc import Callable
from typing import Any

from aeron_spark.transport.errors import InvalidFrameError
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    HEADER,
    SETUP_LENGTH,
    SETUP_PEEK,
    SM,
    SM_LENGTH,
    DataFlags,
    FrameType,
    SetupFrame,
    SmFlags,
    frame_type_of,
)
from aeron_spark.transport.protocol.image import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    ImagePhase,
    ImageState,
    system_random,
)
from aeron_spark.transport.protocol.logbuffer import (
    MAX_UDP_PAYLOAD_LENGTH,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
    is_power_of_two,
)
from aeron_spark.transport.protocol.prefix_rate import PrefixRateLimiter
from aeron_spark.transport.protocol.schedule import DueQueue
from aeron_spark.transport.protocol.tally import Tally, attach, detach

SEND_SETUP_INTERVAL_NS = 100_000_000
ELICIT_INTERVAL_NS = 100_000_000
ELICIT_CONNECTED_INTERVAL_NS = 1_000_000_000
COOL_DOWN_NS = 1_000_000_000

_I32 = struct.Struct("<i")
_i32_from = _I32.unpack_from
_unpack_header = DATA_HEADER.unpack_from
_head_from = HEADER.unpack_from
_setup_peek = SETUP_PEEK.unpack_from  # session, stream, term length, mtu (from 12)
_TYPE_DATA = int(FrameType.DATA)
_TYPE_PAD = int(FrameType.PAD)
_TYPE_SETUP = int(FrameType.SETUP)
_EOS = int(DataFlags.EOS)
_IMAGE_CLOSED = ImagePhase.CLOSED

Address = Any
Transmit = Callable[[Any, Address], None]


class StreamInterest:
    """One subscription's interest in one stream id on this endpoint, with its images."""

    def __init__(
        self,
        stream_id: int,
        *,
        session_id: int | None = None,
        control_address: Address | None = None,
        receiver_window: int = 128 * 1024,
        nak_delay_ns: int = 100_000,
        reliable: bool = True,
        idle_sm_interval_ns: int = 0,
        max_term_length: int = TERM_MAX_LENGTH,
        max_mtu: int = MAX_UDP_PAYLOAD_LENGTH,
        max_images: int = 0,
        max_images_per_source: int = 0,
        max_images_per_address: int = 0,
        setups_per_prefix_per_s: int = 0,
        admit_source: Callable[[str], bool] | None = None,
        evict_unvouched: bool = False,
        on_image: Callable[[ImageState], None] | None = None,
        on_image_gone: Callable[[ImageState], None] | None = None,
        on_data: Callable[[], None] | None = None,
        rng: random.Random = system_random,
        group_tag: int | None = None,
        liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS,
    ) -> None:
        self.stream_id = stream_id
        self.liveness_timeout_ns = liveness_timeout_ns  # its images' (no packet this long: gone)
        self.group_tag = group_tag  # the gtag our images' SMs carry (None: none)
        self.session_id = session_id
        self.control_address = control_address
        self.receiver_window = receiver_window
        self.nak_delay_ns = nak_delay_ns
        self.reliable = reliable
        self.idle_sm_interval_ns = idle_sm_interval_ns  # its images' (0: Aeron's 200 ms)
        self.max_term_length = max_term_length  # SETUPs asking for more are refused
        self.max_mtu = max_mtu
        # 0: no limit. A SETUP past any makes no image (a flood of valid SETUPs with new
        # session ids would otherwise cost a log, SMs and loop time each). A source is one
        # sender's socket (address and port), an address all sockets of one IP address (of
        # one IPv6 /64: address_key).
        self.max_images = max_images
        self.max_images_per_source = max_images_per_source
        self.max_images_per_address = max_images_per_address
        self.images_per_source: dict[Any, int] = {}
        # new images per second for the senders of one /24 or /64 (0: no limit)
        self.setups_per_prefix_per_s = setups_per_prefix_per_s
        self.setup_rate = PrefixRateLimiter(setups_per_prefix_per_s)
        # the sender hosts this subscription makes images for (None: any), asked once per host
        self.admit_source = admit_source
        self.admitted: dict[str, bool] = {}
        # at a full limit, a SETUP evicts the oldest image not vouched for (see _victim)
        self.evict_unvouched = evict_unvouched
        self.on_image = on_image
        self.on_image_gone = on_image_gone
        self.on_data = on_data
        self.receiver_id = rng.getrandbits(63)
        self.data_pending = False  # on_data is due at the dispatcher's next do_work
        self.images: dict[int, ImageState] = {}
        self.elicit_deadline_ns = 0
        self.closed = False


class ReceiveDispatcher:
    """Routes the datagrams of one receive endpoint to images; counts what it drops."""

    def __init__(self) -> None:
        self.interests: dict[int, tuple[StreamInterest, ...]] = {}
        # ``add`` runs on the caller's thread (the client adding a subscription), the removal
        # of finished interests in ``do_work`` on the receiver's: both rewrite one stream's
        # tuple, so both do it under this lock (no I/O, no clock: only the two writers)
        self._interests_lock = threading.Lock()
        self.pending_setups: dict[tuple[int, int], int] = {}
        self.cool_down: dict[tuple[int, int], int] = {}
        self.status_messages_sent = 0
        self.setups_received = 0
        self.setups_rejected = 0
        self.images_refused = 0
        self.images_evicted = 0  # unvouched images dropped for a new sender's SETUP at a limit
        self.setups_rate_limited = 0  # SETUPs past the new images per /24 or /64 per second
        self.setups_source_refused = 0  # SETUPs from a host the subscription does not admit
        self._prune_above = 256  # prune cool_down / pending_setups when they grow past this
        self.unknown_session_data = 0
        self.data_wrong_source = 0  # DATA for an image from another source than its SETUP's
        self.invalid_frames = 0
        self.heartbeats_received = 0
        self.images_created = 0
        self.images_removed = 0
        self.retired: dict[str, int] = {}  # counts of images already removed
        self.tally = Tally()  # the live images' counts, kept as they count (tally.py)
        self.data_notifications = 0  # on_data calls (at most one per interest per do_work)
        self._arrived: list[StreamInterest] = []  # interests whose on_data is due
        self._sm = bytearray(SM_LENGTH)
        # images and eliciting interests to step: kicked, or at their deadline
        self.due: DueQueue[ImageState | StreamInterest] = DueQueue()
        self._owner: dict[ImageState, StreamInterest] = {}  # each live image's interest
        # closed interests that may have no image left: removed at the next step, each from
        # its own stream's tuple (a walk of every stream per removal made closing N sessions
        # on one socket O(N^2): issue 31)
        self._finishing: list[StreamInterest] = []

    # --------------------------------------------------------------- registration

    def add(self, interest: StreamInterest) -> None:
        with self._interests_lock:
            current = self.interests.get(interest.stream_id, ())
            self.interests[interest.stream_id] = (*current, interest)
        if interest.control_address is not None:
            self.due.ready.append(interest)  # its first elicit goes now

    def remove(self, interest: StreamInterest, now_ns: int) -> None:
        """Close an interest; its images send EOS SMs on the next steps and go away."""
        interest.closed = True
        for image in list(interest.images.values()):
            image.is_closing = True
        self._finishing.append(interest)
        self.due.ready.append(interest)  # removed on the next step if it has no image

    def has_interests(self) -> bool:
        return bool(self.interests)

    # --------------------------------------------------------------- datagrams

    def on_datagram(
        self, buf: Any, length: int, source: Address, now_ns: int, transmit: Transmit
    ) -> int:
        """Handle one datagram (``buf[:length]``); raises InvalidFrameError if malformed."""
        if length < 8:
            raise InvalidFrameError(f"datagram of {length} bytes is shorter than a frame header")
        if buf[4] != 0:
            raise InvalidFrameError(f"unsupported protocol version {buf[4]}")
        ftype = buf[6] | (buf[7] << 8)
        if ftype == _TYPE_DATA or ftype == _TYPE_PAD:
            return self._on_data(buf, length, source, now_ns, transmit)
        if ftype == _TYPE_SETUP:
            if length == SETUP_LENGTH and self._refused_setup(buf, source):
                return 0
            return self._on_setup(SetupFrame.decode(buf[:length]), source, now_ns)
        frame_type_of(buf[:length])  # validates; SM/NAK/RTTM/ERR here are for publications
        return 0

    def _on_data(
        self, buf: Any, length: int, source: Address, now_ns: int, transmit: Transmit
    ) -> int:
        if length < DATA_HEADER_LENGTH:
            raise InvalidFrameError(f"DATA datagram of {length} bytes, need 32")
        (frame_length, _v, flags, _t, term_offset, session_id, stream_id, term_id, _r) = (
            _unpack_header(buf, 0)
        )
        interests = self.interests.get(stream_id)
        if interests is None:
            return 0
        if term_offset < 0 or term_offset & (FRAME_ALIGNMENT - 1):
            raise InvalidFrameError(f"DATA term_offset {term_offset} is not a multiple of 32")
        if frame_length == 0:
            if length != DATA_HEADER_LENGTH:
                raise InvalidFrameError("heartbeat datagram longer than 32 bytes")
            self.heartbeats_received += 1
            extent = length
        else:
            extent = _check_frames(buf, length)
        work = 0
        known = False
        for interest in interests:
            image = interest.images.get(session_id)
            if image is None:
                continue
            known = True
            if source[:2] != image.source_address[:2]:
                # An image is bound to the source of its SETUP: DATA for it from anywhere else
                # (a spoofer that learnt or guessed the session id) is dropped and counted.
                self.data_wrong_source += 1
                continue
            if term_offset + extent > image.term_length:
                raise InvalidFrameError(f"DATA at {term_offset}+{length} runs past the term")
            if image.on_data(buf, length, term_id, term_offset, now_ns, extent):
                work += 1
                if interest.on_data is not None and not interest.data_pending:
                    interest.data_pending = True
                    self._arrived.append(interest)
            if image.eos_position is not None or image.needs_work():
                # stepped only when it has something to do (a gap to scan, an SM due, its
                # end of stream): in-order data moved it already, and each step per datagram
                # was a fifth of a receiver's work (issue 31)
                image.kick()
        if not known and not flags & _EOS:
            key = (session_id, stream_id)
            if key in self.cool_down:
                if now_ns < self.cool_down[key]:
                    return work
                del self.cool_down[key]
            due = self.pending_setups.get(key)
            if due is not None and now_ns < due:  # asked for its SETUP a moment ago
                self.unknown_session_data += 1
                return work
            if any(
                not i.closed
                and (i.session_id is None or i.session_id == session_id)
                and not _is_full(i, source)  # no SETUP of this source could make an image
                and _admits(i, source)
                for i in interests
            ):
                self.unknown_session_data += 1
                self.pending_setups[key] = now_ns + SEND_SETUP_INTERVAL_NS
                target = next(
                    (i.control_address for i in interests if i.control_address is not None),
                    source,
                )
                self._send_sm(
                    transmit,
                    target,
                    session_id,
                    stream_id,
                    interests[0].receiver_id,
                    SmFlags.SEND_SETUP,
                )
                work += 1
        return work

    def _refused_setup(self, buf: Any, source: Address) -> bool:
        """True (and counted) for a SETUP that every interest refuses for its geometry or image
        limits, read from the bytes without decoding a frame object: a flood of them is cheap.
        False when the full path must decide."""
        if _i32_from(buf, 0)[0] != SETUP_LENGTH:
            return False  # malformed: the full path raises
        session_id, stream_id, term_length, mtu = _setup_peek(buf, 12)
        interests = self.interests.get(stream_id)
        if not interests or term_length <= 0 or mtu <= 0:
            return False
        rejected = refused = not_admitted = 0
        for i in interests:
            if i.session_id not in (None, session_id):
                continue  # filtered out: this interest ignores the SETUP either way
            if i.closed or session_id in i.images:
                return False
            if not _admits(i, source):
                not_admitted += 1
            elif term_length > i.max_term_length or mtu > i.max_mtu:
                rejected += 1
            elif _is_full(i, source):
                if _victim(i, source) is not None:
                    return False  # the full path evicts
                refused += 1
            else:
                return False
        if not rejected + refused + not_admitted:
            return False
        self.setups_received += 1
        self.setups_rejected += rejected
        self.images_refused += refused
        self.setups_source_refused += not_admitted
        return True

    def _on_setup(self, setup: SetupFrame, source: Address, now_ns: int) -> int:
        self.setups_received += 1
        interests = self.interests.get(setup.stream_id)
        if interests is None:
            return 0
        term_length = setup.term_length
        if not (is_power_of_two(term_length) and TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH):
            raise InvalidFrameError(f"SETUP term_length {term_length} is not a valid term length")
        mtu = setup.mtu
        if not (
            DATA_HEADER_LENGTH < mtu <= MAX_UDP_PAYLOAD_LENGTH
            and mtu % FRAME_ALIGNMENT == 0
            and mtu <= term_length // 2
        ):
            raise InvalidFrameError(f"SETUP mtu {mtu} is not valid")
        if not 0 <= setup.term_offset < term_length or setup.term_offset % FRAME_ALIGNMENT:
            raise InvalidFrameError(f"SETUP term_offset {setup.term_offset} is not valid")
        key = (setup.session_id, setup.stream_id)
        until = self.cool_down.get(key)
        if until is not None:
            if now_ns < until:
                return 0
            del self.cool_down[key]
        work = 0
        for interest in interests:
            if interest.closed or setup.session_id in interest.images:
                continue
            if interest.session_id is not None and interest.session_id != setup.session_id:
                continue
            if not _admits(interest, source):
                self.setups_source_refused += 1  # no image, no log, no reply
                continue
            if term_length > interest.max_term_length or mtu > interest.max_mtu:
                self.setups_rejected += 1  # costs us nothing: no image, no log, no reply
                continue
            victim = None
            if _is_full(interest, source):
                victim = _victim(interest, source)
                if victim is None:
                    self.images_refused += 1
                    continue
            if interest.setups_per_prefix_per_s and not interest.setup_rate.allows(
                source_prefix(source), now_ns
            ):
                self.setups_rate_limited += 1  # its publication sends SETUP again later
                continue
            if victim is not None:
                self._retire(interest, victim, now_ns)
                self.images_evicted += 1
            image = ImageState(
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                initial_term_id=setup.initial_term_id,
                active_term_id=setup.active_term_id,
                term_offset=setup.term_offset,
                term_length=term_length,
                mtu=mtu,
                source_address=source,
                control_address=interest.control_address,
                receiver_window=interest.receiver_window,
                nak_delay_ns=interest.nak_delay_ns,
                reliable=interest.reliable,
                idle_sm_interval_ns=interest.idle_sm_interval_ns,
                receiver_id=interest.receiver_id,
                now_ns=now_ns,
                group_tag=interest.group_tag,
                liveness_timeout_ns=interest.liveness_timeout_ns,
            )
            attach(self.tally, image)
            interest.images[setup.session_id] = image
            self._owner[image] = interest
            image.wakeups = self.due.ready
            image.kick()
            per_source = interest.images_per_source
            for counted in (source[:2], address_key(source)):
                per_source[counted] = per_source.get(counted, 0) + 1
            self.images_created += 1
            self.pending_setups.pop(key, None)
            if interest.on_image is not None:
                interest.on_image(image)
            work += 1
        return work

    def _retire(self, interest: StreamInterest, image: ImageState, now_ns: int) -> None:
        """Remove an image (done, or evicted): its counts kept, its session id cooled down."""
        del interest.images[image.session_id]
        self._owner.pop(image, None)
        self.due.forget(image)
        image.wakeups = None
        if interest.closed and not interest.images:
            self._finishing.append(interest)
        self.images_removed += 1
        _forget_source(interest, image.source_address)
        detach(image)
        for name, value in image_counts(image).items():
            self.retired[name] = self.retired.get(name, 0) + value
        self.cool_down[(image.session_id, image.stream_id)] = now_ns + COOL_DOWN_NS
        if interest.control_address is not None and not interest.closed:
            # a session-specific interest had no deadline while it held this image (_elicit):
            # it asks again once the session id's cool-down is over, as the second-long
            # check it replaced found it at the latest
            interest.elicit_deadline_ns = now_ns + COOL_DOWN_NS
            self.due.schedule(interest, interest.elicit_deadline_ns)
        if not image.is_done:
            image.request_close()
        if interest.on_image_gone is not None:
            interest.on_image_gone(image)

    def _send_sm(
        self,
        transmit: Transmit,
        address: Address,
        session_id: int,
        stream_id: int,
        receiver_id: int,
        flags: int,
    ) -> None:
        SM.pack_into(
            self._sm,
            0,
            SM_LENGTH,
            0,
            flags,
            FrameType.SM,
            session_id,
            stream_id,
            0,
            0,
            0,
            receiver_id,
        )
        transmit(bytes(self._sm), address)
        self.status_messages_sent += 1

    # --------------------------------------------------------------- timers

    def _data_arrived(self, interest: StreamInterest) -> None:
        """``interest``'s ``on_data`` is due (at most once until :meth:`notify_data`)."""
        if interest.on_data is not None and not interest.data_pending:
            interest.data_pending = True
            self._arrived.append(interest)

    def notify_data(self) -> int:
        """Call ``on_data`` of every interest that got data since the last call (once each)."""
        arrived = self._arrived
        if not arrived:
            return 0
        self._arrived = []
        for interest in arrived:  # first: a callback that raises must not strand the others
            interest.data_pending = False
        for interest in arrived:
            if interest.on_data is not None:
                interest.on_data()
        self.data_notifications += len(arrived)
        return len(arrived)

    def do_work(self, now_ns: int, transmit: Transmit) -> int:
        work = self.notify_data()
        due = self.due
        ready = due.ready
        owner = self._owner
        for item in due.take(now_ns):
            if isinstance(item, ImageState):
                interest = owner.get(item)
                if interest is None:
                    continue  # retired meanwhile
                item.kicked = False  # before do_work: a kick from now on queues it again
                filled = item.gaps_filled
                work += item.do_work(now_ns, transmit)
                if item.gaps_filled != filled:
                    # an unreliable image padded a gap: what lay behind it is readable now,
                    # and nothing arrived to signal it (a subscriber woken only by on_data,
                    # as the stream server's loop, waited for the next datagram)
                    self._data_arrived(interest)
                if item.phase is _IMAGE_CLOSED:  # is_done
                    self._retire(interest, item, now_ns)
                elif item.needs_work():
                    ready.append(item)
                else:
                    due.schedule(item, item.next_deadline_ns)
            elif item.control_address is not None and not item.closed:
                work += self._elicit(item, now_ns, transmit)
        if self._arrived:  # gaps padded in this step: woken now, not at the next step
            work += self.notify_data()
        if self._finishing:
            self._remove_finished()
        if len(self.cool_down) + len(self.pending_setups) > self._prune_above:
            # amortized: a flood of new session ids costs O(1) per datagram, not O(entries)
            self.cool_down = {k: v for k, v in self.cool_down.items() if v > now_ns}
            self.pending_setups = {k: v for k, v in self.pending_setups.items() if v > now_ns}
            self._prune_above = max(256, 2 * (len(self.cool_down) + len(self.pending_setups)))
        return work

    def _elicit(self, interest: StreamInterest, now_ns: int, transmit: Transmit) -> int:
        """A multi-destination-cast subscription asks its control address for SETUPs, every
        100 ms until it has an image, then every second; one that names its session asks
        nothing while it has that session's image (its heartbeats and our SMs keep both sides
        joined; each request cost a SETUP every 100 ms until our next SM, our sessions' idle
        SMs being a second apart: issue 31)."""
        work = 0
        if interest.session_id is not None and interest.session_id in interest.images:
            # nothing to ask while it has its session's image, so no deadline either: its
            # image's retirement schedules the next request (a second-long timer a session
            # re-armed for nothing was a due-queue take and push a second per idle session on
            # a client holding thousands; issue 31)
            interest.elicit_deadline_ns = now_ns + ELICIT_CONNECTED_INTERVAL_NS
            return 0
        if now_ns >= interest.elicit_deadline_ns:
            # a session-specific subscription names its session (a secure session's
            # publication answers only SMs that carry its own, secret, id)
            self._send_sm(
                transmit,
                interest.control_address,
                interest.session_id or 0,
                interest.stream_id,
                interest.receiver_id,
                SmFlags.SEND_SETUP,
            )
            interval = ELICIT_CONNECTED_INTERVAL_NS if interest.images else ELICIT_INTERVAL_NS
            interest.elicit_deadline_ns = now_ns + interval
            work = 1
        self.due.schedule(interest, interest.elicit_deadline_ns)
        return work

    def _remove_finished(self) -> None:
        """Forget the closed interests noted since the last step that have no image left (one
        with images is noted again when its last one goes: ``_retire``)."""
        finishing, self._finishing = self._finishing, []
        with self._interests_lock:  # from the current tuples: one added meanwhile stays
            for interest in finishing:
                if interest.images:
                    continue
                current = self.interests.get(interest.stream_id)
                if current is None or interest not in current:
                    continue  # noted twice
                remaining = tuple(i for i in current if i is not interest)
                if remaining:
                    self.interests[interest.stream_id] = remaining
                else:
                    del self.interests[interest.stream_id]

    def next_deadline_ns(self, now_ns: int) -> int:
        """When :meth:`do_work` next has something to do (``now_ns`` or earlier: now)."""
        deadline = self.due.next_ns(now_ns + 1_000_000_000)
        return now_ns if self._finishing and deadline > now_ns else deadline

    def images(self) -> list[ImageState]:
        """Every image, safe to call from another thread than the receiver's (stats snapshots):
        each dict is copied in one step (``list`` of a dict view runs without releasing the GIL)
        before it is walked, so the receiver adding or removing an image meanwhile cannot break
        the iteration ("dictionary changed size during iteration" killed a server's loop)."""
        return [
            im
            for interests in list(self.interests.values())
            for i in list(interests)
            for im in list(i.images.values())
        ]


def _admits(interest: StreamInterest, source: Address) -> bool:
    """Whether the subscription makes images for the sender host of ``source`` (its
    ``admit_source``, asked once per host; the answers kept are bounded)."""
    admit = interest.admit_source
    if admit is None:
        return True
    host = str(source[0])
    known = interest.admitted.get(host)
    if known is None:
        if len(interest.admitted) >= 4096:
            interest.admitted.clear()
        known = interest.admitted[host] = bool(admit(host))
    return known


def _is_full(interest: StreamInterest, source: Address) -> bool:
    """Whether the interest takes no more images: in all, from this source (address and port)
    or from its IP address."""
    if interest.max_images and len(interest.images) >= interest.max_images:
        return True
    counts = interest.images_per_source  # keyed (host, port) for sources, address_key else
    limit = interest.max_images_per_source
    if limit and counts.get(source[:2], 0) >= limit:
        return True
    limit = interest.max_images_per_address
    return bool(limit) and counts.get(address_key(source), 0) >= limit


def _victim(interest: StreamInterest, source: Address) -> ImageState | None:
    """The image a SETUP from ``source`` may evict at a full limit: the oldest image nobody
    vouched for within the narrowest limit that is full (this socket's, this address's, else
    the whole subscription's, there from the /24 or /64 holding the most such images, so one
    network's unvouched images never keep a newcomer from another network out). None: refuse."""
    if not interest.evict_unvouched:
        return None
    counts = interest.images_per_source
    if interest.max_images_per_source and (
        counts.get(source[:2], 0) >= interest.max_images_per_source
    ):
        scope = [im for im in interest.images.values() if im.source_address[:2] == source[:2]]
    elif interest.max_images_per_address and (
        counts.get(address := address_key(source), 0) >= interest.max_images_per_address
    ):
        scope = [im for im in interest.images.values() if address_key(im.source_address) == address]
    else:
        by_prefix: dict[str, list[ImageState]] = {}
        for im in interest.images.values():
            if not im.vouched:
                by_prefix.setdefault(source_prefix(im.source_address), []).append(im)
        if not by_prefix:
            return None
        scope = max(by_prefix.values(), key=len)  # ties: the first (oldest) prefix seen
    for image in scope:  # creation order: the oldest first
        if not image.vouched:
            return image
    return None


def source_prefix(source: Address) -> str:
    """The network a sender is accounted in: its /24 (IPv4, IPv4-mapped IPv6 too) or /64."""
    host = str(source[0])
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    if ":" not in host:
        return host.rpartition(".")[0]
    return _v6_prefix(host)


@functools.lru_cache(maxsize=4096)  # per SETUP from IPv6 senders; bounded under a flood
def _v6_prefix(host: str) -> str:
    try:
        return ipaddress.ip_network(f"{host.partition('%')[0]}/64", strict=False).compressed
    except ValueError:
        return host


def address_key(source: Address) -> str:
    """What ``max_images_per_address`` counts a sender under: its IPv4 address (an IPv4-mapped
    one too) as it is, an IPv6 address as its /64, from which one host may pick as many source
    addresses as it likes (each had images of its own up to the limit); as the handshake
    counts its clients (``address_share``) and the setup rate (``source_prefix``)."""
    host = str(source[0])
    if ":" not in host or (host.startswith("::ffff:") and "." in host):
        return host
    return _v6_prefix(host)


def _forget_source(interest: StreamInterest, source: Address) -> None:
    counts = interest.images_per_source
    for key in (source[:2], address_key(source)):
        left = counts.get(key, 0) - 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)


def _check_frames(buf: Any, length: int) -> int:
    """Every frame of a DATA datagram lies inside it; a PAD frame may only come last.

    Returns the extent of the datagram in the term (a final PAD covers the rest of the term).
    """
    offset = 0
    head = _head_from
    while offset < length:
        if length - offset < DATA_HEADER_LENGTH:
            raise InvalidFrameError(f"{length - offset} trailing bytes after the last frame")
        frame_length, version, _flags, ftype = head(buf, offset)
        if (
            ftype == _TYPE_DATA
            and version == 0
            and DATA_HEADER_LENGTH <= frame_length <= length - offset
        ):
            offset += (frame_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
            continue
        if ftype == _TYPE_PAD:
            if frame_length < DATA_HEADER_LENGTH or offset + DATA_HEADER_LENGTH != length:
                raise InvalidFrameError("PAD frame that is not the last of its datagram")
            return offset + frame_length
        raise InvalidFrameError(
            f"frame (type {ftype:#x}, version {version}, length {frame_length}) at {offset} "
            "is not a valid DATA frame"
        )
    return length


# (system counter name, attribute) of the counters an image keeps
IMAGE_COUNTERS = (
    ("naks_sent", "naks_sent"),
    ("status_messages_sent", "status_messages_sent"),
    ("flow_control_over_runs", "over_runs"),
    ("flow_control_under_runs", "under_runs"),
    ("gaps_filled", "gaps_filled"),
)


def image_counts(image: ImageState) -> dict[str, int]:
    """The counters an image keeps, under their system counter names."""
    return {name: getattr(image, attribute) for name, attribute in IMAGE_COUNTERS}

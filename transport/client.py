"""The client API, once for every media: :class:`Publication`, :class:`Subscription`,
:class:`Image` and :class:`BufferClaim`.

They are written over two small interfaces that each media implements:

- a **log buffer** (:class:`PublicationLog` on the publishing side; on the reading side an
  :class:`ImageLog`, the reader's state over the terms): UDP's are in-process terms that the
  driver's sender and receiver step (``transport.driver.client``); IPC's are memory-mapped files
  shared with other processes (``transport.ipc``);
- a **signal** (:class:`Signal`) that blocking helpers wait on: UDP's is an event the driver
  sets (or, in invoker mode, stepping the driver); IPC's is a back-off (nothing in another
  process can wake us), timed by the sans-I/O :mod:`aeron_spark.transport.protocol.ipc`.

A subscription also has a :class:`SubscriptionMedia`: what happens after a poll (UDP: wake the
receiver to send a status message; IPC: publish the position in the subscriber's slot), its own
duty cycle (IPC: scan for publications, heartbeat, retire images), closing, and where user
callbacks' errors go.

A publication is exclusive (one thread offers) or concurrent (``offer`` takes a lock). Handlers
given to ``poll`` run on the caller's thread; image callbacks (``on_available_image`` /
``on_unavailable_image``) run on the thread that found or retired the image (a driver thread, or
the caller's in invoker mode) and must not block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from aeron_spark.transport.api import (
    BlockHandler,
    ControlledFragmentHandler,
    ImageStream,
    PublicationStream,
    offer_blocking,
)
from aeron_spark.transport.protocol.publication import abort_claim, commit_claim
from aeron_spark.transport.protocol.term import FragmentHandler

# What a blocking helper waits for: room under the limit, a subscriber, data or images.
WaitKind = Literal["limit", "connect", "data"]


class Signal(Protocol):
    """How a blocking helper waits (never by spinning)."""

    def wait_until(self, ready: Callable[[], bool], deadline: float, kind: WaitKind) -> bool:
        """Until ``ready()`` or ``deadline`` (``time.monotonic()`` seconds); ``ready()``'s last
        value."""
        ...

    def notify(self) -> None:
        """Something a waiter may be waiting for happened (called from another thread)."""
        ...


class PublicationLog(PublicationStream, Protocol):
    """A publication's log buffer as its media keeps it."""

    state: Any  # the media's sans-I/O state (UDP: the driver's PublicationState)
    spy_notify: tuple[Callable[[], None], ...]

    @property
    def signal(self) -> Signal: ...
    @property
    def sender_position(self) -> int: ...
    @property
    def local_endpoints(self) -> list[tuple[str, int]]: ...
    @property
    def destinations(self) -> list[tuple[str, int]]: ...
    @property
    def destination_hosts(self) -> frozenset[str]: ...
    @property
    def last_status_ns(self) -> int | None: ...

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int) -> int:
        """Append one message (the caller holds the lock of a concurrent publication)."""
        ...

    def offer_block(self, block: bytes | bytearray | memoryview) -> int:
        """Append a block of whole framed fragments to the current term (the caller holds the
        lock of a concurrent publication)."""
        ...

    def claim(self, length: int, reserved_value: int) -> tuple[memoryview, int] | int:
        """Reserve a frame (``(term, frame_offset)``) with a negative length, or a result code."""
        ...

    def appended(self) -> None:
        """A message was appended (or a claim committed/aborted): let the readers know."""
        ...

    def limit_ready(self) -> bool:
        """Whether an offer might now succeed: room under the (refreshed) limit, or closed."""
        ...

    def allow_destination_hosts(self, hosts: frozenset[str] | None) -> None: ...
    def add_destination(self, endpoint: str) -> None: ...
    def do_work(self, now_ns: int) -> int: ...
    def close(self) -> None: ...


class ImageLog(ImageStream, Protocol):
    """The reading side of one publisher's log (UDP: the driver's ImageState)."""

    subscriber_position: int

    def has_data(self) -> bool: ...


class SubscriptionMedia(Protocol):
    """What a subscription's media does besides reading logs."""

    @property
    def signal(self) -> Signal: ...

    def attach(self, subscription: Subscription) -> None:
        """Called once, at the end of the subscription's construction."""
        ...

    def after_poll(self, log: Any) -> None:
        """A reader moved on in ``log`` (one of this media's image logs)."""
        ...

    def do_work(self, now_ns: int) -> int: ...
    def close(self) -> None: ...
    def record_error(self, exc: BaseException) -> None:
        """A user callback raised ``exc``."""
        ...


class BufferClaim:
    """A frame reserved in the log by :meth:`Publication.try_claim`; write ``buffer``, then commit.

    Until :meth:`commit` or :meth:`abort` the frame blocks the stream (readers and the sender
    stop at it), so claim, write and commit promptly.
    """

    __slots__ = ("_term", "_offset", "buffer", "position", "_publication", "_done")

    def __init__(
        self, publication: Publication, term: memoryview, offset: int, length: int, position: int
    ) -> None:
        self._publication = publication
        self._term = term
        self._offset = offset
        self.buffer = term[offset + 32 : offset + 32 + length]
        self.position = position
        self._done = False

    def commit(self) -> int:
        if not self._done:
            self._done = True
            commit_claim(self._term, self._offset)
            self._publication._log.appended()
        return self.position

    def abort(self) -> None:
        if not self._done:
            self._done = True
            abort_claim(self._term, self._offset)
            self._publication._log.appended()

    def __enter__(self) -> BufferClaim:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class Publication:
    """A publication on any media: ``offer`` messages, read its position and limit."""

    def __init__(self, log: PublicationLog, channel: str, exclusive: bool) -> None:
        self._log = log
        self._state = log.state
        self._signal = log.signal
        self.channel = channel
        self.exclusive = exclusive
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.mtu = log.mtu
        self.max_message_length = log.max_message_length
        self.max_payload_length = log.max_payload_length
        self._lock = None if exclusive else threading.Lock()
        self._append = log.offer
        self._appended = log.appended

    # -------------------------------------------------------------- state

    @property
    def state(self) -> Any:
        """The media's sans-I/O state of this publication (UDP: the driver's
        ``PublicationState``), for the driver."""
        return self._state

    @property
    def position(self) -> int:
        return self._log.position

    @property
    def position_limit(self) -> int:
        return self._log.position_limit

    @property
    def sender_position(self) -> int:
        return self._log.sender_position

    @property
    def is_connected(self) -> bool:
        return self._log.is_connected

    @property
    def is_closed(self) -> bool:
        return self._log.is_closed

    @property
    def last_status_ns(self) -> int | None:
        """When (``time.monotonic_ns``, this host's clock) a subscriber last showed it is alive:
        UDP, the newest status message of a connected receiver (an idle one still sends one
        every ``idle-sm-interval``); IPC, the newest heartbeat of a live subscriber's slot (its
        process alive). None: no subscriber is connected. A cheap read, for liveness checks."""
        return self._log.last_status_ns

    def add_lost_listener(self, listener: Callable[[], object]) -> bool:
        """Have ``listener()`` called (from a driver thread: keep it cheap) whenever a
        subscriber may have gone (UDP: a receiver's status messages timed out, it ended its
        stream, its destination was dropped): the only ways :attr:`is_connected` turns False
        but for this publication's own close, so one thread can watch many publications'
        connections without asking each on a clock. False when the media cannot tell (IPC):
        ask :attr:`is_connected` then."""
        add = getattr(self._log, "add_lost_listener", None)
        return bool(add(listener)) if add is not None else False

    def remove_lost_listener(self, listener: Callable[[], object]) -> None:
        remove = getattr(self._log, "remove_lost_listener", None)
        if remove is not None:
            remove(listener)

    @property
    def local_endpoints(self) -> list[tuple[str, int]]:
        """Addresses of the socket this publication sends from (its control port for MDC)."""
        return self._log.local_endpoints

    @property
    def destinations(self) -> list[tuple[str, int]]:
        """Where data goes now (the endpoint, or the receivers learned in dynamic MDC)."""
        return self._log.destinations

    @property
    def destination_hosts(self) -> frozenset[str]:
        """The IP addresses this publication currently sends to (dynamic: learnt from SMs)."""
        return self._log.destination_hosts

    def allow_destination_hosts(self, hosts: frozenset[str] | None) -> None:
        """Which IP addresses' SMs may make (and keep) a destination of this dynamic
        publication (None: anyone). Others' SMs and NAKs are refused and counted."""
        self._log.allow_destination_hosts(hosts)

    def add_destination(self, endpoint: str) -> None:
        """Manual multi-destination-cast: also send to ``endpoint`` (``host:port``)."""
        self._log.add_destination(endpoint)

    @property
    def spy_notify(self) -> tuple[Callable[[], None], ...]:
        """Called after each append: the driver's spy subscriptions' data signals."""
        return self._log.spy_notify

    @spy_notify.setter
    def spy_notify(self, value: tuple[Callable[[], None], ...]) -> None:
        self._log.spy_notify = value

    # -------------------------------------------------------------- offer

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message; the new position (> 0) or NOT_CONNECTED, BACK_PRESSURED,
        ADMIN_ACTION, CLOSED or MAX_POSITION_EXCEEDED."""
        if self._lock is None:
            result = self._append(payload, reserved_value)
        else:
            with self._lock:
                result = self._append(payload, reserved_value)
        if result > 0:
            self._appended()
        return result

    def offer_block(self, block: bytes | bytearray | memoryview) -> int:
        """Append a block of whole, already framed fragments (Aeron's
        ``ExclusivePublication.offerBlock``): copied into the current term with each frame's
        term offset, session, stream and term id rewritten to this publication's, the first
        frame's length written last (readers see whole frames only). The new position, or a
        result code as :meth:`offer`. A block must fit the rest of the current term (a full
        term is rotated first): one that does not, or holds anything but whole frames (the
        first one DATA), raises :class:`~aeron_spark.transport.errors.LocalProtocolError`."""
        if self._lock is None:
            result = self._log.offer_block(block)
        else:
            with self._lock:
                result = self._log.offer_block(block)
        if result > 0:
            self._appended()
        return result

    def offer_block_blocking(
        self, block: bytes | bytearray | memoryview, *, timeout_s: float = 10.0
    ) -> int:
        """:meth:`offer_block`, retried on BACK_PRESSURED/ADMIN_ACTION/NOT_CONNECTED as
        :meth:`offer_blocking`."""
        offerer: Any = _BlockOffer(self)
        return offer_blocking(offerer, self._wait_for_limit, block, 0, timeout_s)

    def try_claim(self, length: int, reserved_value: int = 0) -> BufferClaim | int:
        """Reserve ``length`` bytes (at most ``max_payload_length``) in the log, or a code."""
        if self._lock is not None:
            self._lock.acquire()
        try:
            claimed = self._log.claim(length, reserved_value)
            if isinstance(claimed, int):
                return claimed
            term, offset = claimed
            return BufferClaim(self, term, offset, length, self._log.position)
        finally:
            if self._lock is not None:
                self._lock.release()

    def _wait_for_limit(self, deadline: float) -> bool:
        """Wait (not spin) until an offer may succeed; False at the deadline."""
        return self._signal.wait_until(self._log.limit_ready, deadline, "limit")

    def wait_until_connected(self, timeout_s: float) -> bool:
        """Block until a subscriber is connected or ``timeout_s`` passes."""
        log = self._log
        deadline = time.monotonic() + timeout_s
        self._signal.wait_until(lambda: log.is_connected or log.is_closed, deadline, "connect")
        return log.is_connected

    def offer_blocking(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        reserved_value: int = 0,
        timeout_s: float = 10.0,
    ) -> int:
        """Offer, retrying on BACK_PRESSURED/ADMIN_ACTION/NOT_CONNECTED until ``timeout_s``
        (:func:`~aeron_spark.transport.api.offer_blocking`)."""
        return offer_blocking(self, self._wait_for_limit, payload, reserved_value, timeout_s)

    def do_work(self, now_ns: int) -> int:
        """The media's own duty (IPC: heartbeat and refresh the limit); the driver steps it."""
        return self._log.do_work(now_ns)

    def next_deadline_ns(self, now_ns: int, poll_ns: int) -> int | None:
        """When the driver must step it next (None: no deadline of its own); media that
        cannot tell are stepped every ``poll_ns``."""
        deadline = getattr(self._log, "next_deadline_ns", None)
        return now_ns + poll_ns if deadline is None else deadline(now_ns, poll_ns)

    def close(self) -> None:
        """Stop accepting offers; what was offered is still delivered (UDP: then EOS, linger;
        IPC: subscribers drain to the end, the last one removes the file)."""
        if self._lock is None:
            self._log.close()
        else:
            with self._lock:
                self._log.close()
        self._signal.notify()

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Publication({self.channel!r}, stream_id={self.stream_id}, "
            f"session_id={self.session_id}, position={self.position})"
        )


class _BlockOffer:
    """A publication whose ``offer`` offers a block (for :func:`offer_blocking`)."""

    def __init__(self, pub: Publication) -> None:
        self._pub = pub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pub, name)

    def offer(self, block: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        return self._pub.offer_block(block)


class Image:
    """One publisher's stream as seen by a subscription."""

    def __init__(self, state: ImageLog, subscription: Subscription) -> None:
        self._state = state
        self.subscription = subscription
        self._after_poll = subscription._media.after_poll
        self.session_id = state.session_id
        self.stream_id = state.stream_id
        self.initial_term_id = state.initial_term_id
        self.term_length = state.term_length
        self.mtu = state.mtu
        self.join_position = state.join_position
        self.source_identity = state.source_identity
        # the sender's (address, port) as the socket reports it; None for IPC and spies
        address = getattr(state, "source_address", None)
        self.source_address: tuple[Any, ...] | None = (
            tuple(address) if address is not None and state.source_identity != "spy" else None
        )
        self.closed = False

    @property
    def position(self) -> int:
        return self._state.subscriber_position

    @property
    def is_closed(self) -> bool:
        return self.closed

    @property
    def is_end_of_stream(self) -> bool:
        return self._state.is_end_of_stream

    def vouch(self, vouched: bool = True) -> None:
        """Tell the driver this image's sender proved itself (for a handshake server: a HELLO
        on it was admitted and its handshake or session lives), or with ``False`` that it no
        longer vouches. When a subscription's image limits are reached, a new sender's SETUP
        evicts the oldest image nobody vouches for (``images_evicted``) instead of being
        refused; a vouched image is never evicted. No-op for IPC images."""
        vouch = getattr(self._state, "vouch", None)
        if vouch is not None:
            vouch(vouched)

    @property
    def last_packet_ns(self) -> int | None:
        """The driver's clock (``time.monotonic_ns``) when the last packet of this image
        arrived, data or heartbeat (UDP; None for IPC, whose publisher writes the log)."""
        return getattr(self._state, "last_packet_ns", None)

    def has_data(self) -> bool:
        return not self.closed and self._state.has_data()

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        return self._read(self._state.poll, handler, fragment_limit)

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        return self._read(self._state.controlled_poll, handler, fragment_limit)

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        return self._read(self._state.block_poll, handler, block_length_limit)

    def _read(self, read: Callable[[Any, int], int], handler: Any, limit: int) -> int:
        if self.closed:
            return 0
        count = read(handler, limit)
        self._after_poll(self._state)
        return count

    def __repr__(self) -> str:
        return (
            f"Image(session_id={self.session_id}, stream_id={self.stream_id}, "
            f"source={self.source_identity}, position={self.position})"
        )


class Subscription:
    """Receives the images of one stream on one channel; ``poll`` them in turn."""

    def __init__(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], object] | None,
        on_unavailable_image: Callable[[Image], object] | None,
        media: SubscriptionMedia,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self._media = media
        self._signal = media.signal
        self._on_available = on_available_image
        self._on_unavailable = on_unavailable_image
        self._images: tuple[Image, ...] = ()
        self._by_state: dict[int, Image] = {}
        self._listeners: tuple[Callable[[], object], ...] = ()
        self._round_robin = 0
        self._closed = False
        # bumped by the driver whenever images come or go or data arrives; ``wait`` returns
        # when it moved since the last wait returned (not since the call: a change just
        # before the call is not missed)
        self._changes = 0
        self._changes_seen = 0
        self.local_endpoints: list[tuple[str, int]] = []
        self.registration: Any = None  # the driver's handle on what it registered for us
        media.attach(self)

    # -------------------------------------------------------------- media callbacks
    # Called by the subscription's media only (the driver's conductor, IPC's scanner), never by
    # an application: an image came, an image went, data arrived.

    def image_available(self, state: ImageLog) -> None:
        image = Image(state, self)
        self._by_state[id(state)] = image
        self._images = (*self._images, image)
        self._changes += 1
        self._signal.notify()
        self._notify()
        if self._on_available is not None:
            try:
                self._on_available(image)
            except Exception as exc:  # noqa: BLE001 - a user callback must not kill the driver
                self._media.record_error(exc)

    def image_unavailable(self, state: ImageLog) -> None:
        image = self._by_state.pop(id(state), None)
        if image is None:
            return
        image.closed = True
        self._images = tuple(i for i in self._images if i is not image)
        self._changes += 1
        self._signal.notify()
        self._notify()
        if self._on_unavailable is not None:
            try:
                self._on_unavailable(image)
            except Exception as exc:  # noqa: BLE001
                self._media.record_error(exc)

    def data_arrived(self) -> None:
        self._changes += 1
        self._signal.notify()
        if self._listeners:
            self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception as exc:  # noqa: BLE001 - a user callback must not kill the driver
                self._media.record_error(exc)

    def add_listener(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` (from a driver thread; keep it cheap, e.g. ``Event.set``) whenever
        images come or go, and (UDP; IPC has no cross-process signal: use ``wait``) whenever data
        arrives: lets one thread wait on many subscriptions."""
        self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[], object]) -> None:
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    # -------------------------------------------------------------- client API

    @property
    def images(self) -> list[Image]:
        return list(self._images)

    def image_logs(self) -> list[ImageLog]:
        """The logs of its images, as its media gave them (for the media)."""
        return [image._state for image in self._images]

    def image_by_session_id(self, session_id: int) -> Image | None:
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    @property
    def is_connected(self) -> bool:
        return bool(self._images)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Deliver up to ``fragment_limit`` fragments from the images, round robin."""
        return self._round_robin_read(Image.poll, handler, fragment_limit)

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        return self._round_robin_read(Image.controlled_poll, handler, fragment_limit)

    def _round_robin_read(
        self, read: Callable[[Image, Any, int], int], handler: Any, fragment_limit: int
    ) -> int:
        images = self._images
        count = len(images)
        if count == 0:
            return 0
        start = self._round_robin % count
        self._round_robin = start + 1
        total = 0
        for i in range(count):
            total += read(images[(start + i) % count], handler, fragment_limit - total)
            if total >= fragment_limit:
                break
        return total

    def has_data(self) -> bool:
        for image in self._images:  # a loop, not any() of a generator: asked per wait
            if image.has_data():
                return True
        return False

    def _ready(self) -> bool:
        return self._closed or self._changes != self._changes_seen or self.has_data()

    def wake(self) -> None:
        """End a :meth:`wait` now, or the next one if none waits (any thread, e.g. a
        publication's lost listener): its caller asks again whatever it waits for."""
        self._changes += 1
        self._signal.notify()

    def wait(self, timeout_s: float) -> bool:
        """Block until data may be available or the images changed since the last wait
        returned (a change just before the call counts); False on timeout."""
        try:
            return self._signal.wait_until(self._ready, time.monotonic() + timeout_s, "data")
        finally:
            self._changes_seen = self._changes

    def do_work(self, now_ns: int) -> int:
        """The media's own duty (IPC: scan for publications, heartbeat, retire images)."""
        return self._media.do_work(now_ns)

    def next_deadline_ns(self, now_ns: int, poll_ns: int) -> int | None:
        """When the driver must step it next (None: not before something wakes the driver);
        media that cannot tell are stepped every ``poll_ns``."""
        deadline = getattr(self._media, "next_deadline_ns", None)
        return now_ns + poll_ns if deadline is None else deadline(now_ns, poll_ns)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._media.close()
            self._signal.notify()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        images = len(self._images)
        return f"Subscription({self.channel!r}, stream_id={self.stream_id}, images={images})"


__all__ = [
    "BufferClaim",
    "Image",
    "ImageLog",
    "Publication",
    "PublicationLog",
    "Signal",
    "Subscription",
    "SubscriptionMedia",
    "WaitKind",
]

"""Client API objects: :class:`Publication`, :class:`Subscription`, :class:`Image` and
:class:`BufferClaim`.

They wrap the sans-I/O states that the driver's agents step. A publication is exclusive (one
thread offers) or concurrent (``offer`` takes a lock). Handlers given to ``poll`` run on the
caller's thread; image callbacks (``on_available_image``/``on_unavailable_image``) run on the
driver's receiver thread (the caller's thread in invoker mode) and must not block.

Blocking helpers (``wait_until_connected``, ``offer_blocking``, ``Subscription.wait``) wait on
events the driver sets; they never spin. In invoker mode they step the driver themselves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aeron_spark.transport.api import (
    BlockHandler,
    ControlledFragmentHandler,
    offer_blocking,
)
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.publication import PublicationState, abort_claim, commit_claim
from aeron_spark.transport.protocol.term import FragmentHandler

if TYPE_CHECKING:
    from aeron_spark.transport.driver.driver import Driver


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
            self._publication._after_append()
        return self.position

    def abort(self) -> None:
        if not self._done:
            self._done = True
            abort_claim(self._term, self._offset)
            self._publication._after_append()

    def __enter__(self) -> BufferClaim:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class Publication:
    """A network (or spied) publication: ``offer`` messages, read its position and limit."""

    def __init__(
        self,
        driver: Driver,
        state: PublicationState,
        channel: str,
        exclusive: bool,
        registration: Any,
    ) -> None:
        self._driver = driver
        self._state = state
        self._registration = registration
        self.channel = channel
        self.exclusive = exclusive
        self.session_id = state.session_id
        self.stream_id = state.stream_id
        self.initial_term_id = state.initial_term_id
        self.term_length = state.term_length
        self.mtu = state.mtu
        self.max_message_length = state.max_message_length
        self.max_payload_length = state.max_payload_length
        self._lock = None if exclusive else threading.Lock()
        self._state_offer = state.offer
        self._limit_event = threading.Event()
        self._waiters = 0
        self.spy_notify: tuple[Callable[[], None], ...] = ()
        state.on_limit_change = self._on_limit_change

    # -------------------------------------------------------------- state

    @property
    def position(self) -> int:
        return self._state.appender.position

    def allow_destination_hosts(self, hosts: frozenset[str] | None) -> None:
        """Which IP addresses' SMs may make (and keep) a destination of this dynamic
        publication (None: anyone). Others' SMs and NAKs are refused and counted."""
        self._state.allowed_hosts = None if hosts is None else frozenset(hosts)

    @property
    def destination_hosts(self) -> frozenset[str]:
        """The IP addresses this publication currently sends to (dynamic: learnt from SMs)."""
        return self._state.destination_hosts

    @property
    def position_limit(self) -> int:
        return self._state.publisher_limit

    @property
    def is_connected(self) -> bool:
        return self._state.is_connected

    @property
    def is_closed(self) -> bool:
        return self._state.is_closed

    @property
    def local_endpoints(self) -> list[tuple[str, int]]:
        """Addresses of the socket this publication sends from (its control port for MDC)."""
        reg = self._registration
        local = getattr(getattr(reg, "endpoint", None), "local_address", None)
        return [(str(local[0]), int(local[1]))] if local else []

    @property
    def destinations(self) -> list[tuple[str, int]]:
        """Where data goes now (the endpoint, or the receivers learned in dynamic MDC)."""
        return [(str(a[0]), int(a[1])) for a in list(self._state.destinations)]

    @property
    def sender_position(self) -> int:
        return self._state.sender_position

    # -------------------------------------------------------------- offer

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message; the new position (> 0) or NOT_CONNECTED, BACK_PRESSURED,
        ADMIN_ACTION, CLOSED or MAX_POSITION_EXCEEDED."""
        if self._lock is None:
            result = self._state_offer(payload, reserved_value)
        else:
            with self._lock:
                result = self._state_offer(payload, reserved_value)
        if result > 0:
            runner = self._driver._sender_runner
            if runner is not None and runner.sleeping:
                runner.wake()
            if self.spy_notify:
                for notify in self.spy_notify:
                    notify()
        return result

    def try_claim(self, length: int, reserved_value: int = 0) -> BufferClaim | int:
        """Reserve ``length`` bytes (at most ``max_payload_length``) in the log, or a code."""
        state = self._state
        if self._lock is not None:
            self._lock.acquire()
        try:
            code = state.claim_check(length)
            if code < 0:
                return code
            term, offset = state.claim(length, reserved_value)
            return BufferClaim(self, term, offset, length, state.appender.position)
        finally:
            if self._lock is not None:
                self._lock.release()

    def _after_append(self) -> None:
        self._driver._wake_sender()
        for notify in self.spy_notify:
            notify()

    def _on_limit_change(self) -> None:
        if self._waiters:
            self._limit_event.set()

    def _wait_for_limit(self, deadline: float) -> bool:
        """Wait (not spin) until the limit or connection may have changed; False on timeout."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if self._driver.is_invoker:
            self._driver.do_work()
            self._driver.idle(min(remaining, 0.01))
            return True
        self._waiters += 1
        try:
            self._limit_event.clear()
            if self._state.appender.position < self._state.publisher_limit:
                return True
            self._limit_event.wait(min(remaining, 0.1))
        finally:
            self._waiters -= 1
        return True

    def wait_until_connected(self, timeout_s: float) -> bool:
        """Block until a subscriber is connected (an SM arrived) or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while not self._state.is_connected:
            if self._state.is_closed:
                return False
            if not self._wait_for_limit(deadline):
                return self._state.is_connected
        return True

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

    def add_destination(self, endpoint: str) -> None:
        """Manual multi-destination-cast: also send to ``endpoint`` (``host:port``)."""
        self._driver._add_destination(self, endpoint)

    def close(self) -> None:
        """Stop accepting offers; what was offered is still sent, then EOS, then linger."""
        self._driver._close_publication(self)
        self._limit_event.set()

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Publication({self.channel!r}, stream_id={self.stream_id}, "
            f"session_id={self.session_id}, position={self.position})"
        )


class Image:
    """One publisher's stream as seen by a subscription."""

    def __init__(self, state: ImageState, subscription: Subscription) -> None:
        self._state = state
        self.subscription = subscription
        self.session_id = state.session_id
        self.stream_id = state.stream_id
        self.initial_term_id = state.initial_term_id
        self.term_length = state.term_length
        self.mtu = state.mtu
        self.join_position = state.join_position
        self.source_identity = state.source_identity
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

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        count = self._state.poll(handler, fragment_limit)
        self.subscription._after_poll(self._state)
        return count

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        count = self._state.controlled_poll(handler, fragment_limit)
        self.subscription._after_poll(self._state)
        return count

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        count = self._state.block_poll(handler, block_length_limit)
        self.subscription._after_poll(self._state)
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
        driver: Driver,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], object] | None,
        on_unavailable_image: Callable[[Image], object] | None,
    ) -> None:
        self._driver = driver
        self.channel = channel
        self.stream_id = stream_id
        self._on_available = on_available_image
        self._on_unavailable = on_unavailable_image
        self._images: tuple[Image, ...] = ()
        self._by_state: dict[int, Image] = {}
        self._event = threading.Event()
        self._waiting = 0
        self._listeners: tuple[Callable[[], object], ...] = ()
        self._round_robin = 0
        self._closed = False
        self.local_endpoints: list[tuple[str, int]] = []
        self._registration: Any = None

    # -------------------------------------------------------------- driver callbacks

    def _image_available(self, state: ImageState) -> None:
        image = Image(state, self)
        self._by_state[id(state)] = image
        self._images = (*self._images, image)
        self._event.set()
        self._notify()
        if self._on_available is not None:
            try:
                self._on_available(image)
            except Exception as exc:  # noqa: BLE001 - a user callback must not kill the driver
                self._driver._record_error(exc)

    def _image_unavailable(self, state: ImageState) -> None:
        image = self._by_state.pop(id(state), None)
        if image is None:
            return
        image.closed = True
        self._images = tuple(i for i in self._images if i is not image)
        self._event.set()
        self._notify()
        if self._on_unavailable is not None:
            try:
                self._on_unavailable(image)
            except Exception as exc:  # noqa: BLE001
                self._driver._record_error(exc)

    def _data_arrived(self) -> None:
        if self._waiting:
            self._event.set()
        if self._listeners:
            self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception as exc:  # noqa: BLE001 - a user callback must not kill the driver
                self._driver._record_error(exc)

    def add_listener(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` (from a driver thread; keep it cheap, e.g. ``Event.set``) whenever
        data arrives or an image comes or goes: lets one thread wait on many subscriptions."""
        self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[], object]) -> None:
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    def _after_poll(self, state: ImageState) -> None:
        if state.subscriber_position - state.last_sm_position > state.window >> 2:
            self._driver._wake_receiver()

    # -------------------------------------------------------------- client API

    @property
    def images(self) -> list[Image]:
        return list(self._images)

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
        images = self._images
        count = len(images)
        if count == 0:
            return 0
        start = self._round_robin % count
        self._round_robin = start + 1
        total = 0
        wake = False
        for i in range(count):
            state = images[(start + i) % count]._state
            total += state.poll(handler, fragment_limit - total)
            if state.subscriber_position - state.last_sm_position > state.window >> 2:
                wake = True
            if total >= fragment_limit:
                break
        if wake:
            self._driver._wake_receiver()
        return total

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        images = self._images
        count = len(images)
        if count == 0:
            return 0
        start = self._round_robin % count
        self._round_robin = start + 1
        total = 0
        for i in range(count):
            image = images[(start + i) % count]
            total += image.controlled_poll(handler, fragment_limit - total)
            if total >= fragment_limit:
                break
        return total

    def has_data(self) -> bool:
        return any(image._state.has_data() for image in self._images)

    def wait(self, timeout_s: float) -> bool:
        """Block until data may be available or the images changed; False on timeout."""
        if self._driver.is_invoker:
            deadline = time.monotonic() + timeout_s
            while True:
                self._driver.do_work()
                if self.has_data():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._driver.idle(min(remaining, 0.05))
        self._waiting += 1
        try:
            self._event.clear()
            if self.has_data():
                return True
            return self._event.wait(timeout_s) or self.has_data()
        finally:
            self._waiting -= 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._driver._close_subscription(self)
            self._event.set()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        images = len(self._images)
        return f"Subscription({self.channel!r}, stream_id={self.stream_id}, images={images})"

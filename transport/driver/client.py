"""UDP's side of the client API (:mod:`aeron_spark.transport.client`): the log buffer of a network
(or spied) publication, which is in-process terms the driver's sender reads, and a subscription's
media, whose images' logs are the driver's :class:`ImageState` objects that its receiver fills.

Waiting is on events the driver sets (limit changed, data arrived, images changed); in invoker
mode the waiter steps the driver itself. Nothing here spins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aeron_spark.transport.client import (
    BufferClaim,
    Image,
    Publication,
    Subscription,
    WaitKind,
)
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.publication import PublicationState

if TYPE_CHECKING:
    from aeron_spark.transport.driver.driver import Driver

# Invoker mode: how long a waiter lets the driver sleep between steps (it wakes on sockets).
_INVOKER_IDLE_S: dict[WaitKind, float] = {"limit": 0.01, "connect": 0.01, "data": 0.05}
# Threaded: re-check at least this often (a missed set costs no more; none is missed: the
# driver changes what ``ready`` reads before it opens the gate). A data waiter is woken by the
# data, an image coming or going or the subscription closing; 100 ms slices cost a client
# awaiting a 70 ms reply a wake-up and its checks more (issue 31).
_EVENT_SLICE_S: dict[WaitKind, float] = {"limit": 0.1, "connect": 0.1, "data": 0.5}


class DriverSignal:
    """Waits on a gate the driver's threads open, or (invoker mode) steps the driver.

    The gate is one lock, held while closed: ``notify`` releases it (when a waiter is there),
    a waiter takes it. A ``threading.Event`` was a Condition (made per signal: two per
    session), a lock made per wait and a dozen Python calls a wake-up on the two threads (a
    client's every reply: issue 31). A woken waiter that sees others still waiting opens the
    gate again for the next (each wakes as with an event, one after the other)."""

    __slots__ = ("_driver", "_gate", "_waiters")

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._gate = threading.Lock()
        self._gate.acquire()  # closed
        self._waiters = 0

    def notify(self) -> None:
        if self._waiters:
            try:
                self._gate.release()
            except RuntimeError:
                pass  # open already: a waiter will take it

    def wait_until(self, ready: Callable[[], bool], deadline: float, kind: WaitKind) -> bool:
        driver = self._driver
        if driver.is_invoker:
            while not ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ready()
                driver.do_work()
                if ready():
                    return True
                driver.idle(min(remaining, _INVOKER_IDLE_S[kind]))
            return True
        gate = self._gate
        # ready() is asked once a pass, after the waiter counts itself (a notify from then on
        # opens the gate): not also before, which a waiter for a reply not yet come (the
        # client's every publish) asked for nothing, four Python calls (issue 31)
        while True:
            self._waiters += 1
            try:
                # closed: an opening before ready() below is stale (unless another waits)
                took = gate.acquire(False)
                if ready():
                    if took and self._waiters > 1:
                        _reopen(gate)
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if gate.acquire(True, min(remaining, _EVENT_SLICE_S[kind])) and self._waiters > 1:
                    _reopen(gate)  # the next waiter's turn
            finally:
                self._waiters -= 1


def _reopen(gate: Any) -> None:
    try:
        gate.release()
    except RuntimeError:
        pass  # opened meanwhile


class NetworkPublicationLog:
    """A UDP publication's log: the terms of the driver's :class:`PublicationState`."""

    def __init__(self, driver: Driver, state: PublicationState, registration: Any) -> None:
        self._driver = driver
        self.state = state
        self.registration = registration  # what the driver registered it with (its endpoint)
        self.signal = DriverSignal(driver)
        state.on_limit_change = self.signal.notify
        self.session_id = state.session_id
        self.stream_id = state.stream_id
        self.initial_term_id = state.initial_term_id
        self.term_length = state.term_length
        self.mtu = state.mtu
        self.max_message_length = state.max_message_length
        self.max_payload_length = state.max_payload_length
        self.spy_notify: tuple[Callable[[], None], ...] = ()
        self.offer = state.offer
        self.offer_block = state.offer_block
        self._lost_listeners: tuple[Callable[[], object], ...] = ()

    def add_lost_listener(self, listener: Callable[[], object]) -> bool:
        """Call ``listener()`` (the driver's sender thread: keep it cheap) whenever a
        subscriber may have gone: a receiver's status messages timed out, it ended its stream,
        its destination was dropped (``is_connected`` may have turned False then, and only
        then, but for the publication's own close)."""
        self._lost_listeners = (*self._lost_listeners, listener)
        self.state.on_receiver_lost = self._receiver_lost
        return True

    def remove_lost_listener(self, listener: Callable[[], object]) -> None:
        self._lost_listeners = tuple(x for x in self._lost_listeners if x is not listener)

    def _receiver_lost(self) -> None:
        for listener in self._lost_listeners:
            try:
                listener()
            except Exception as exc:  # noqa: BLE001 - a user callback must not kill the driver
                self._driver.record_error(exc)

    @property
    def position(self) -> int:
        return self.state.appender.position

    @property
    def position_limit(self) -> int:
        return self.state.publisher_limit

    @property
    def sender_position(self) -> int:
        return self.state.sender_position

    @property
    def is_connected(self) -> bool:
        return self.state.is_connected

    @property
    def is_closed(self) -> bool:
        return self.state.is_closed

    @property
    def last_status_ns(self) -> int | None:
        # the receivers' last SM times (the driver's thread writes them: copied in one step)
        return max(tuple(self.state.flow.receivers.values()), default=None)

    @property
    def local_endpoints(self) -> list[tuple[str, int]]:
        local = getattr(getattr(self.registration, "endpoint", None), "local_address", None)
        return [(str(local[0]), int(local[1]))] if local else []

    @property
    def destinations(self) -> list[tuple[str, int]]:
        return [(str(a[0]), int(a[1])) for a in list(self.state.destinations)]

    @property
    def destination_hosts(self) -> frozenset[str]:
        return self.state.destination_hosts

    def allow_destination_hosts(self, hosts: frozenset[str] | None) -> None:
        state = self.state
        state.allowed_hosts = None if hosts is None else frozenset(hosts)
        if state.refused_elicits:  # a newly allowed host's refused SETUP request: answer now
            state.kick()
            self._driver.wake_sender(even_if_awake=True)

    def add_destination(self, endpoint: str) -> None:
        self._driver.add_publication_destination(self, endpoint)

    def claim(self, length: int, reserved_value: int) -> tuple[memoryview, int] | int:
        code = self.state.claim_check(length)
        if code < 0:
            return code
        return self.state.claim(length, reserved_value)

    def appended(self) -> None:
        state = self.state
        # Already kicked: it is queued and not yet stepped (the sender clears the flag before
        # it reads the log), and whoever kicked it woke a sleeping sender: nothing to do. This
        # is every offer but the first of a burst, so it is one attribute read.
        if not state.kicked:
            state.kick()  # before the sleeping check: a runner going to sleep sees it
            self._driver.wake_sender()
        for notify in self.spy_notify:
            notify()

    def limit_ready(self) -> bool:
        state = self.state
        return state.appender.position < state.publisher_limit or state.is_closed

    def do_work(self, now_ns: int) -> int:
        return 0  # the driver's sender steps the state

    def close(self) -> None:
        self._driver.close_publication(self)


class NetworkSubscriptionMedia:
    """A UDP (or spy) subscription's media: the driver finds and retires its images."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self.signal = DriverSignal(driver)
        self._subscription: Subscription | None = None

    def attach(self, subscription: Subscription) -> None:
        self._subscription = subscription

    def after_poll(self, state: ImageState) -> None:
        if state.subscriber_position - state.last_sm_position > state.window >> 2:
            self._driver.wake_receiver()  # time for a status message (the poll kicked it)

    def do_work(self, now_ns: int) -> int:
        return 0  # the driver's receiver steps the images

    def close(self) -> None:
        assert self._subscription is not None
        self._driver.close_subscription(self._subscription)

    def record_error(self, exc: BaseException) -> None:
        self._driver.record_error(exc)


def network_publication(
    driver: Driver, state: PublicationState, channel: str, exclusive: bool, registration: Any
) -> Publication:
    return Publication(NetworkPublicationLog(driver, state, registration), channel, exclusive)


def network_subscription(
    driver: Driver,
    channel: str,
    stream_id: int,
    on_available_image: Callable[[Image], object] | None,
    on_unavailable_image: Callable[[Image], object] | None,
) -> Subscription:
    media = NetworkSubscriptionMedia(driver)
    return Subscription(channel, stream_id, on_available_image, on_unavailable_image, media)


__all__ = [
    "BufferClaim",
    "DriverSignal",
    "Image",
    "NetworkPublicationLog",
    "NetworkSubscriptionMedia",
    "Publication",
    "Subscription",
    "network_publication",
    "network_subscription",
]

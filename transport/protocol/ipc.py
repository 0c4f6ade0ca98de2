"""The decisions of ``aeron:ipc``, sans I/O: flow-control limit, liveness, duty intervals, joining,
retiring images and the back-off of a waiter that nothing wakes.

The I/O shell (:mod:`aeron_spark.transport.ipc`) reads the shared log file (slots, heartbeats,
positions, whether a pid lives) and the clock, and hands what it read to these functions and
objects; they never read a clock, sleep or touch a file. Times are ``now_ns`` values of one
monotonic clock (``CLOCK_MONOTONIC``, system-wide on Linux, so comparable across processes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aeron_spark.transport.api import BACK_PRESSURED, MAX_POSITION_EXCEEDED, NOT_CONNECTED

PUBLISHER_HEARTBEAT_INTERVAL_NS = 100_000_000
SUBSCRIBER_HEARTBEAT_INTERVAL_NS = 100_000_000
SCAN_INTERVAL_NS = 20_000_000
# how often the driver steps an IPC resource that cannot say when (an image's data and its
# publisher's end are polled): a thousand wake-ups a second bought nothing over a hundred
DUTY_INTERVAL_NS = 10_000_000

SLOT_FREE = 0
SLOT_USED = 1
LOG_ACTIVE = 1
LOG_CLOSED = 2


class Interval:
    """A duty due every ``interval_ns`` (a heartbeat, a directory scan); due at once at first."""

    __slots__ = ("interval_ns", "next_ns")

    def __init__(self, interval_ns: int, first_ns: int = 0) -> None:
        if interval_ns <= 0:
            raise ValueError(f"interval_ns must be positive, not {interval_ns}")
        self.interval_ns = interval_ns
        self.next_ns = first_ns

    def due(self, now_ns: int) -> bool:
        """True (and the next one scheduled ``interval_ns`` from now) when the duty is due."""
        if now_ns < self.next_ns:
            return False
        self.next_ns = now_ns + self.interval_ns
        return True


class Backoff:
    """Exponential back-off for a waiter polling another process's memory (no event can wake it):
    ``initial_ns``, doubling to ``max_ns``, never past the deadline."""

    __slots__ = ("initial_ns", "max_ns", "delay_ns")

    def __init__(self, initial_ns: int, max_ns: int) -> None:
        if not 0 < initial_ns <= max_ns:
            raise ValueError(f"back-off needs 0 < initial_ns <= max_ns ({initial_ns}, {max_ns})")
        self.initial_ns = initial_ns
        self.max_ns = max_ns
        self.delay_ns = initial_ns

    def reset(self) -> None:
        self.delay_ns = self.initial_ns

    def next_delay_ns(self, now_ns: int, deadline_ns: int) -> int:
        """How long to sleep now (0: the deadline passed, stop waiting); the next one doubles."""
        remaining = deadline_ns - now_ns
        if remaining <= 0:
            return 0
        delay = self.delay_ns
        self.delay_ns = min(delay * 2, self.max_ns)
        return min(delay, remaining)


# Back-offs of the IPC waits (initial, max): offer_blocking's wait for the limit, a subscription's
# wait for data, wait_until_connected.
LIMIT_BACKOFF_NS = (50_000, 1_000_000)
DATA_BACKOFF_NS = (50_000, 1_000_000)
CONNECT_BACKOFF_NS = (500_000, 10_000_000)


def heartbeat_fresh(now_ns: int, heartbeat_ns: int, liveness_timeout_ns: int) -> bool:
    return now_ns - heartbeat_ns < liveness_timeout_ns


def party_live(
    in_use: bool,
    heartbeat_ns: int,
    pid: int,
    now_ns: int,
    liveness_timeout_ns: int,
    pid_alive: Callable[[int], bool],
) -> bool:
    """A subscriber's slot, or a log's publisher, is live while in use (slot used, log active),
    its heartbeat fresh and its process alive. ``pid_alive`` is asked last, only if needed: a live
    slot counts for the limit and is not taken over; a live publisher's image stays."""
    return in_use and heartbeat_fresh(now_ns, heartbeat_ns, liveness_timeout_ns) and pid_alive(pid)


def join_position(claimed: int, latest: int, term_length: int) -> int:
    """Where a new subscriber starts. It claimed its slot at ``claimed``; the publisher may have
    run on (for other subscribers) to ``latest`` before it saw the slot. Within half a term
    nothing not yet read can have been cleaned (the publisher cleans two terms ahead), so every
    message from the claim on is kept; further than that, it joins at ``latest``."""
    return latest if latest - claimed >= term_length // 2 else claimed


def image_retired(
    log_state: int,
    position: int,
    end_position: int,
    publisher_is_live: Callable[[], bool],
    has_data: Callable[[], bool],
) -> bool:
    """Whether a subscriber lets an image go: its publisher closed and it read to the end, or the
    publisher died and every complete frame it wrote has been read. (The callables are asked only
    when needed: they read another process's state.)"""
    if log_state == LOG_CLOSED:
        return position >= end_position
    return not publisher_is_live() and not has_data()


class PublisherLimit:
    """An IPC publication's flow control: the limit is the slowest live subscriber's position
    plus ``window``; it is cached, and refreshed from the slots (:meth:`update`) only when a
    message does not fit under it, so a plain offer reads no other process's memory."""

    __slots__ = ("window", "max_position", "limit", "connected")

    def __init__(self, window: int, term_length: int) -> None:
        if window <= 0 or window > term_length // 2:
            raise ValueError(f"an IPC window must be in (0, term_length/2], not {window}")
        self.window = window
        self.max_position = (1 << 31) * term_length - 1
        self.limit = 0
        self.connected = False

    def update(self, live_positions: Iterable[int]) -> int:
        """The subscribers' positions (of the live slots) were read: the new limit."""
        slowest = min(live_positions, default=None)
        self.connected = slowest is not None
        self.limit = 0 if slowest is None else slowest + self.window
        return self.limit

    def fits(self, end_position: int) -> bool:
        return end_position <= self.limit

    def beyond_max(self, end_position: int) -> bool:
        return end_position > self.max_position

    def refusal(self) -> int:
        """The offer result when a message does not fit under the (refreshed) limit."""
        return BACK_PRESSURED if self.connected else NOT_CONNECTED


__all__ = [
    "CONNECT_BACKOFF_NS",
    "DATA_BACKOFF_NS",
    "LIMIT_BACKOFF_NS",
    "LOG_ACTIVE",
    "LOG_CLOSED",
    "MAX_POSITION_EXCEEDED",
    "PUBLISHER_HEARTBEAT_INTERVAL_NS",
    "SCAN_INTERVAL_NS",
    "SLOT_FREE",
    "SLOT_USED",
    "SUBSCRIBER_HEARTBEAT_INTERVAL_NS",
    "Backoff",
    "Interval",
    "PublisherLimit",
    "heartbeat_fresh",
    "image_retired",
    "join_position",
    "party_live",
]

"""The sans-I/O IPC rules (``transport.protocol.ipc``) on a manual clock: limit, liveness,
duty intervals, joining, retiring and back-off. No file, no sleep, no real clock."""

from __future__ import annotations

import pytest

from aeron_spark.transport.api import BACK_PRESSURED, NOT_CONNECTED
from aeron_spark.transport.protocol import ipc as rules

MS = 1_000_000
LIVENESS = 10_000 * MS


class Clock:
    def __init__(self, now_ns: int = 5_000 * MS) -> None:
        self.now_ns = now_ns

    def advance(self, ns: int) -> int:
        self.now_ns += ns
        return self.now_ns


def test_interval_is_due_at_once_then_every_interval() -> None:
    clock = Clock()
    interval = rules.Interval(100 * MS)
    assert interval.due(clock.now_ns)
    assert not interval.due(clock.advance(99 * MS))
    assert interval.due(clock.advance(1 * MS))
    assert not interval.due(clock.now_ns)
    assert interval.due(clock.advance(250 * MS))  # late: due once, rescheduled from now
    assert not interval.due(clock.advance(99 * MS))
    with pytest.raises(ValueError, match="positive"):
        rules.Interval(0)


def test_backoff_doubles_to_its_cap_and_never_sleeps_past_the_deadline() -> None:
    clock = Clock()
    deadline = clock.now_ns + 10 * MS
    backoff = rules.Backoff(1 * MS, 4 * MS)
    delays = []
    while (delay := backoff.next_delay_ns(clock.now_ns, deadline)) > 0:
        delays.append(delay)
        clock.advance(delay)
    assert delays == [1 * MS, 2 * MS, 4 * MS, 3 * MS]  # the last cut to the deadline
    assert clock.now_ns == deadline
    assert backoff.next_delay_ns(clock.advance(1), deadline) == 0
    backoff.reset()
    assert backoff.next_delay_ns(clock.now_ns, clock.now_ns + 100 * MS) == 1 * MS
    with pytest.raises(ValueError):
        rules.Backoff(2 * MS, 1 * MS)


def test_the_ipc_waits_back_off_from_tens_of_microseconds_to_at_most_ten_milliseconds() -> None:
    for initial, maximum in (
        rules.LIMIT_BACKOFF_NS,
        rules.DATA_BACKOFF_NS,
        rules.CONNECT_BACKOFF_NS,
    ):
        assert 0 < initial <= maximum <= 10 * MS


def test_limit_is_the_slowest_live_subscriber_plus_the_window() -> None:
    limit = rules.PublisherLimit(window=32_768, term_length=65_536)
    assert (limit.limit, limit.connected) == (0, False)
    assert limit.refusal() == NOT_CONNECTED
    assert limit.update([4096, 1024, 8192]) == 1024 + 32_768
    assert limit.connected and limit.refusal() == BACK_PRESSURED
    assert limit.fits(1024 + 32_768) and not limit.fits(1024 + 32_768 + 1)
    assert limit.update([]) == 0 and not limit.connected  # every subscriber gone
    assert limit.max_position == (1 << 31) * 65_536 - 1
    assert limit.beyond_max(limit.max_position + 1) and not limit.beyond_max(limit.max_position)


def test_a_window_beyond_half_a_term_would_let_the_publisher_clean_what_is_read() -> None:
    with pytest.raises(ValueError, match="window"):
        rules.PublisherLimit(window=32_769, term_length=65_536)
    with pytest.raises(ValueError, match="window"):
        rules.PublisherLimit(window=0, term_length=65_536)


def test_a_slot_or_publisher_is_live_in_use_fresh_and_alive_and_the_pid_is_asked_last() -> None:
    clock = Clock()
    asked: list[int] = []

    def alive(pid: int) -> bool:
        asked.append(pid)
        return pid != 666

    now = clock.now_ns
    fresh = now - (LIVENESS - 1)
    stale = now - LIVENESS
    assert rules.party_live(True, fresh, 42, now, LIVENESS, alive)
    assert not rules.party_live(True, fresh, 666, now, LIVENESS, alive)  # its process died
    assert asked == [42, 666]
    assert not rules.party_live(True, stale, 42, now, LIVENESS, alive)
    assert not rules.party_live(False, fresh, 42, now, LIVENESS, alive)  # slot free, log closed
    assert asked == [42, 666]  # a stale heartbeat or a party not in use never costs a syscall
    # the heartbeat goes stale exactly one liveness timeout after it was written
    written = clock.now_ns
    assert rules.heartbeat_fresh(clock.advance(LIVENESS - 1), written, LIVENESS)
    assert not rules.heartbeat_fresh(clock.advance(1), written, LIVENESS)


def test_a_subscriber_joins_where_it_claimed_unless_the_publisher_ran_half_a_term_on() -> None:
    term = 65_536
    assert rules.join_position(1024, 1024, term) == 1024
    assert rules.join_position(1024, 1024 + term // 2 - 32, term) == 1024
    assert rules.join_position(1024, 1024 + term // 2, term) == 1024 + term // 2


def test_an_image_retires_when_drained_after_close_or_empty_after_its_publisher_died() -> None:
    def never() -> bool:
        raise AssertionError("not asked when the log is closed")

    assert rules.image_retired(rules.LOG_CLOSED, 4096, 4096, never, never)
    assert not rules.image_retired(rules.LOG_CLOSED, 2048, 4096, never, never)
    assert not rules.image_retired(rules.LOG_ACTIVE, 0, 0, lambda: True, never)
    assert not rules.image_retired(rules.LOG_ACTIVE, 0, 0, lambda: False, lambda: True)
    assert rules.image_retired(rules.LOG_ACTIVE, 0, 0, lambda: False, lambda: False)

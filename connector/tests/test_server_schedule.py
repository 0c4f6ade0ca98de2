"""The server loop's session schedule on a manual clock (issue 31 item 1): a pass serves what
signalled, what is busy and what is due for its check, never every open session."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from aeron_spark.connector.server.schedule import (
    CHECK_GRID_NS,
    CHECK_INTERVAL_NS,
    LOST_GRACE_NS,
    MAX_CHECKS_PER_PASS,
    WATCHED_CHECK_INTERVAL_NS,
    SessionSchedule,
)
from aeron_spark.errors import ConfigurationError

PASS_NS = 20_000_000  # the loop's idle wait: 50 passes a second


def _opened(n: int, now_ns: int = 0) -> SessionSchedule:
    schedule = SessionSchedule(rng=random.Random(7))
    for key in range(n):
        schedule.add(key, now_ns)
    assert sorted(schedule.due(now_ns)) == list(range(n))  # each served once as it opens
    return schedule


def test_idle_sessions_are_served_once_per_check_interval_spread_over_it() -> None:
    n = 2048
    schedule = _opened(n)
    served: Counter[int] = Counter()
    largest = 0
    seconds = 10
    for step in range(1, seconds * 1_000_000_000 // PASS_NS + 1):
        due = schedule.due(step * PASS_NS)
        largest = max(largest, len(due))
        served.update(due)
    # every session checked once a second, none more: 10 in 10 s (the first check falls
    # anywhere in the first second, so 9 or 10)
    assert set(served) == set(range(n))
    assert min(served.values()) >= seconds - 1
    assert max(served.values()) <= seconds
    # spread: a pass serves about n / 10 of them (a slot of the check grid), never all
    assert largest <= 3 * n * CHECK_GRID_NS // CHECK_INTERVAL_NS
    assert schedule.checks == sum(served.values())


def test_watched_sessions_are_checked_once_per_watched_interval_the_others_each_second() -> None:
    """A session whose connection's loss signals it (``watched``: UDP, the reply
    publication's lost receivers, its subscription's images) is checked every
    ``WATCHED_CHECK_INTERVAL_NS`` only, a safety net (main: every second, ~20 Python calls a
    session-second on the loop); one that is not watched keeps the check a second, one that
    cannot signal is served every pass."""
    n = 2048
    schedule = SessionSchedule(rng=random.Random(7))
    for key in range(n):
        schedule.add(key, 0, watched=key % 2 == 0)
    schedule.add("ipc", 0, signals=False, watched=True)  # cannot signal: watched means nothing
    schedule.due(0)
    served: Counter[object] = Counter()
    largest = 0
    seconds = 30
    for step in range(1, seconds * 1_000_000_000 // PASS_NS + 1):
        due = schedule.due(step * PASS_NS)
        largest = max(largest, len(due) - 1)
        served.update(due)
    watched = [served[k] for k in range(0, n, 2)]
    others = [served[k] for k in range(1, n, 2)]
    rounds = seconds * 1_000_000_000 // WATCHED_CHECK_INTERVAL_NS
    assert rounds - 1 <= min(watched) and max(watched) <= rounds  # 2 or 3 in 30 s
    assert seconds - 1 <= min(others) and max(others) <= seconds
    assert served["ipc"] == seconds * 1_000_000_000 // PASS_NS
    assert largest <= 3 * (n // 2) * CHECK_GRID_NS // CHECK_INTERVAL_NS  # still spread
    # a watched session's first check falls anywhere in its first interval, not its first second
    early = SessionSchedule(rng=random.Random(7))
    for key in range(n):
        early.add(key, 0, watched=True)
    early.due(0)
    firsts = sum(len(early.due(step * PASS_NS)) for step in range(1, 1_000_000_000 // PASS_NS + 1))
    assert firsts <= 2 * n * CHECK_INTERVAL_NS // WATCHED_CHECK_INTERVAL_NS
    with pytest.raises(ConfigurationError, match="watched_interval_ns"):
        SessionSchedule(check_interval_ns=2_000_000_000, watched_interval_ns=1_000_000_000)


def test_a_lost_signal_is_re_checked_at_its_graces_end_the_latest_grace_wins() -> None:
    """A lost signal (the reply publication's receiver went) is a re-check ``LOST_GRACE_NS``
    later, not a serve at once (s20's version: signalled, served on the next pass, closed by
    that look): until then the session is in grace (the loop does not close it for its
    connection); a later signal moves the re-check to its own grace's end; the re-check is
    one serve, as a check (no read); a forgotten session is never re-checked."""
    schedule = SessionSchedule(
        rng=random.Random(7), check_interval_ns=10**15, watched_interval_ns=10**15
    )
    for key in ("a", "b", "c"):
        schedule.add(key, 0, watched=True)
    schedule.due(0)
    assert schedule.lose("a", 1_000) is True  # the first since the pass: wake the loop
    assert schedule.lose("b", 2_000) is False  # the wake-up pending takes it too
    assert not schedule.in_grace("a")  # a pass takes it
    assert schedule.due(5_000) == [] and schedule.in_grace("a") and schedule.in_grace("b")
    assert schedule.next_check_ns() == 1_000 + LOST_GRACE_NS
    schedule.lose("b", 1_000_000_000)  # lost again, later: its grace runs from then
    schedule.lose("c", 10)
    schedule.forget("c")
    served: list[tuple[int, object]] = []
    for now in range(PASS_NS, 5 * LOST_GRACE_NS, PASS_NS):
        for key in schedule.due(now):
            served.append((now, key))
            assert key in schedule.checking and not schedule.in_grace(key)
    first_a = next(now for now, key in served if key == "a")
    assert 1_000 + LOST_GRACE_NS <= first_a < 1_000 + LOST_GRACE_NS + PASS_NS
    assert [key for _now, key in served] == ["a", "b"]  # once each; c forgotten
    first_b = next(now for now, key in served if key == "b")
    assert 1_000_000_000 + LOST_GRACE_NS <= first_b < 1_000_000_000 + LOST_GRACE_NS + PASS_NS
    assert schedule.rechecks == 2 and not schedule.in_grace("a")
    assert schedule.next_check_ns() == min(at for at, _n, _k in schedule._checks)
    with pytest.raises(ConfigurationError, match="lost_grace_ns"):
        SessionSchedule(lost_grace_ns=-1)


def test_a_signalled_session_is_served_on_the_next_pass_and_only_it() -> None:
    schedule = _opened(100)
    schedule.due(1)  # any check that fell in the first nanosecond
    thread = threading.Thread(target=schedule.signalled.append, args=(42,))
    thread.start()  # a driver thread signals
    thread.join()
    assert schedule.due(2) == [42]
    assert schedule.due(3) == []  # served: nothing more until its check or its next signal


def test_busy_sessions_are_served_every_pass_until_done() -> None:
    schedule = _opened(10)
    schedule.set_busy(3, True)
    for step in range(1, 6):
        assert 3 in schedule.due(step)
    schedule.set_busy(3, False)
    assert 3 not in schedule.due(6)


def test_unsignalled_sessions_are_served_every_pass() -> None:
    schedule = SessionSchedule(rng=random.Random(1))
    schedule.add("ipc", 0, signals=False)
    schedule.add("udp", 0)
    schedule.due(0)
    for step in range(1, 20):
        due = schedule.due(step)
        assert "ipc" in due
        assert "udp" not in due  # its check is far off at this clock (ns)


def test_a_forgotten_session_is_never_served_again() -> None:
    schedule = _opened(50)
    schedule.set_busy(7, True)
    schedule.signalled.append(8)
    schedule.forget(7)
    schedule.forget(8)
    seen: set[int] = set()
    for step in range(1, 200):
        seen.update(schedule.due(step * PASS_NS))
    assert 7 not in seen and 8 not in seen
    assert len(schedule) == 48
    # the heap drops what was forgotten as it surfaces: no entry of a closed session is kept
    schedule.next_check_ns()
    assert len(seen) == 48


def _drain(schedule: SessionSchedule, now_ns: int) -> list[int]:
    """What the passes at ``now_ns`` serve until none is overdue (the loop does not sleep
    while a check is: ``next_check_ns`` is behind it)."""
    served: list[int] = []
    while True:
        served.extend(schedule.due(now_ns))
        at = schedule.next_check_ns()
        if at is None or at > now_ns:
            return served


def test_a_late_pass_serves_each_session_once_and_the_checks_go_on_from_it() -> None:
    schedule = _opened(500)
    due = _drain(schedule, 5 * CHECK_INTERVAL_NS)  # the loop stalled for 5 s
    assert sorted(due) == list(range(500))  # each once, not five times
    # a second on, every session is due once again, and not before
    assert _drain(schedule, 5 * CHECK_INTERVAL_NS + CHECK_INTERVAL_NS - 1) == []
    assert sorted(_drain(schedule, 6 * CHECK_INTERVAL_NS)) == list(range(500))


def test_idle_sessions_checks_share_the_loops_passes() -> None:
    """Issue 31: an idle loop sleeps until the next check (``next_check_ns``); with each
    session's check at its own instant, 2,048 idle sessions woke it ~2,000 times a second, a
    whole pass each. The checks now fall on a 100 ms grid: at most 10 passes a second, every
    session still checked once a second."""
    n = 2048
    schedule = _opened(n)
    served: Counter[int] = Counter()
    wakeups = 0
    now = 0
    while True:
        at = schedule.next_check_ns()
        assert at is not None
        if at > 3 * CHECK_INTERVAL_NS:
            break
        if at > now:  # the loop sleeps until then (a slot's later passes follow at once)
            wakeups += 1
            now = at
        served.update(schedule.due(now))
    assert wakeups <= 3 * CHECK_INTERVAL_NS // CHECK_GRID_NS + 1, wakeups
    assert set(served) == set(range(n)) and min(served.values()) >= 2
    assert max(served.values()) <= 3


def test_sessions_due_only_for_their_check_are_marked_checking() -> None:
    """Issue 31 item 1: a session due only for its check gets the connection check alone, no
    read (the loop reads ``checking``); one that also signalled or is busy is served fully."""
    n = MAX_CHECKS_PER_PASS + 2  # all of them in one pass (7 and 8 served anyway)
    schedule = _opened(n)
    schedule.set_busy(7, True)
    schedule.signalled.append(8)
    due = schedule.due(CHECK_INTERVAL_NS)  # every first check has fallen due by now
    assert sorted(due) == list(range(n))
    assert schedule.checking == set(range(n)) - {7, 8}
    assert schedule.checks == n - 2
    assert schedule.due(CHECK_INTERVAL_NS + 1) == [7] and schedule.checking == set()


def test_a_pass_takes_a_bounded_number_of_checks_and_serves_signals_between_them() -> None:
    """Issue 31 (publish tail): the checks of a grid slot (~205 at 2,048 sessions, each a read
    of its session) were all taken by one pass, and a publish that arrived meanwhile waited
    behind them. A pass now takes at most ``MAX_CHECKS_PER_PASS`` sessions due only for their
    check; the slot's others are taken by the passes right after, with what signalled served
    by each of them; every session is still checked once a second."""
    n = 2048
    schedule = _opened(n)
    schedule.add("publisher", 0)  # a session publishing all the while
    assert schedule.due(0) == ["publisher"]
    assert MAX_CHECKS_PER_PASS <= 64
    served: Counter[int] = Counter()
    largest = 0
    signalled_late = 0
    now = 0
    while True:
        at = schedule.next_check_ns()
        assert at is not None
        if at > 3 * CHECK_INTERVAL_NS:
            break
        now = max(now, at)
        schedule.signalled.append("publisher")  # a publish arrives during every pass
        due = schedule.due(now)
        checks_only = [k for k in due if k in schedule.checking]
        largest = max(largest, len(checks_only))
        signalled_late += "publisher" not in due
        served.update(k for k in due if isinstance(k, int))
    # main: a pass took a whole slot's checks (~205), a publish behind them
    assert largest <= MAX_CHECKS_PER_PASS, largest
    assert signalled_late == 0  # every pass served what signalled before it
    assert set(served) == set(range(n))
    assert 2 <= min(served.values()) and max(served.values()) <= 3
    # the publisher's checks fell in passes that served it anyway: no check of its own
    assert schedule.checks == sum(served.values())


def test_the_checks_per_pass_bound_is_checked() -> None:
    with pytest.raises(ConfigurationError):
        SessionSchedule(max_checks_per_pass=0)


def test_a_session_served_since_its_last_check_is_not_checked_again_until_an_interval_on() -> None:
    """Issue 31: a session publishing once a second was served twice a second, once for its
    message and once for its check (a look at the connection its serve had just looked at). A
    session served since its last check now has that check put off to a check interval after
    the serve; one that stops being served is checked again an interval after its last serve
    (and a grid slot at most), then every interval."""
    n = 256
    schedule = _opened(n)
    served: Counter[int] = Counter()
    checked_while_publishing: Counter[int] = Counter()
    checked_after: Counter[int] = Counter()
    last_serve: dict[int, int] = {}
    gaps: list[int] = []
    publishing_ns = 3 * CHECK_INTERVAL_NS
    for step in range(1, 5 * CHECK_INTERVAL_NS // PASS_NS + 1):
        now = step * PASS_NS
        if now < publishing_ns:  # each publishes once a second, at its own instant
            for key in range(n):
                if (key * 7_919_993 + now) % CHECK_INTERVAL_NS < PASS_NS:
                    schedule.signalled.append(key)
        for key in schedule.due(now):
            if key not in schedule.checking:
                served[key] += 1
            elif CHECK_INTERVAL_NS <= now < publishing_ns:  # each published in the last second
                checked_while_publishing[key] += 1
            else:
                checked_after[key] += 1
                if now > publishing_ns:
                    gaps.append(now - last_serve[key])
            last_serve[key] = now
    assert min(served.values()) >= 2  # a publish a second for 3 s
    # main: every session checked twice in those 2 s beside its publishes
    assert sum(checked_while_publishing.values()) == 0, sum(checked_while_publishing.values())
    assert schedule.deferred >= n
    # each check an interval (and a grid slot at most) after the session's last look
    assert CHECK_INTERVAL_NS - PASS_NS <= min(gaps), min(gaps)
    assert max(gaps) <= CHECK_INTERVAL_NS + CHECK_GRID_NS + PASS_NS, max(gaps)
    # checked again once no longer served: 2 s after the publishes, 1-2 checks each
    assert set(checked_after) == set(range(n))


def test_only_the_first_signal_since_a_pass_took_them_wakes_the_loop() -> None:
    """Issue 31: the loop was woken by every message (a futex wake and a GIL hand-off each);
    now only by the first key signalled since a pass took the signalled keys."""
    schedule = _opened(10)
    assert schedule.signal(1) is True  # wake the loop
    assert schedule.signal(2) is False  # the pending wake-up's pass takes it
    assert schedule.signal(1) is False
    assert schedule.due(1) == [1, 2]
    assert schedule.signal(3) is True  # after a pass took them: wake again
    thread = threading.Thread(target=schedule.signal, args=(4,))  # a driver thread
    thread.start()
    thread.join()
    assert schedule.due(2) == [3, 4]
    assert schedule.due(3) == []

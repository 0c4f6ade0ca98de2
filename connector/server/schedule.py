"""Which sessions a pass of the server's loop serves (issue 31 item 1), sans I/O.

A pass used to serve every open session (and later every one on a sweep, 4 a second): with 512
idle sessions the loop did nothing else. Now it serves only

* the sessions whose subscription **signalled** (a driver thread appends the session's key to
  ``signalled`` when a message arrives or an image comes or goes, :meth:`SessionSchedule.signal`:
  ``deque.append`` is atomic, and a flag says whether the loop must be woken for it: only the
  first key since a pass took them; the only things another thread does here);
* the **busy** ones (replies queued behind back pressure, replays, input left unread);
* those whose media cannot signal (**unsignalled**: IPC), every pass;
* and every session once per ``check_interval_ns``, whatever it did: its connection checked
  (a publication whose client stopped sending status messages signalled nothing). A session
  whose connection's loss signals it too (``watched``: the reply publication tells when its
  receiver goes, ``Publication.add_lost_listener``; images coming and going signal already)
  is checked once per ``watched_interval_ns`` (10 s), a safety net (issue 31: the check a
  second was ~20 Python calls a session-second, a sixth of an idle server's CPU at 2,048
  sessions). A **lost** signal (:meth:`SessionSchedule.lose`) is not a verdict: it schedules
  the session's re-check ``lost_grace_ns`` (3 s) later, and until then the session is ``in
  grace`` (the loop does not close it for its reply publication's loss alone while a grace is
  pending: the check at the grace's end, after its last lost signal, must still find it gone;
  its client's CLOSE or its image gone close it at once, as before). A live receiver whose
  status messages lapsed or that ended an image and subscribed again speaks again within its
  idle status-message interval (1 s), after the receiver's cool-down (1 s) for a new image; a
  session closed at the signal itself had no such chance (and the reverted first version of
  this, closing at once, was the fastest possible detection, which also turned a test's race
  with its client's exit into a failure). A session
  due only for its check (``checking``: not signalled, not busy, not unsignalled) gets that
  check alone, no read: anything that arrived signalled it (issue 31 item 1: the check's
  read was most of an idle session's cost on the loop). Each session has one entry in a heap
  of check times; a check is due again a check interval after the last one (not after the
  pass that made it), so checks stay spread over the interval as the sessions' openings were
  (the first is anywhere in the first interval, ``rng``), never all in one pass. Check times
  fall on a grid (``CHECK_GRID_NS``, 100 ms: ten slots a second), so the checks of many
  sessions share a pass: a check a pass, at 2,048 sessions two thousand wake-ups of the loop a
  second, each a whole pass (issue 31); on a 20 ms grid still fifty. A pass takes at most
  ``max_checks_per_pass`` sessions due only for their check (``MAX_CHECKS_PER_PASS``); the rest
  of a slot stay due and are taken by the passes right after it (the loop does not sleep while
  a check is overdue), with what signalled meanwhile served between them: at 2,048 sessions a
  slot's ~205 checks in one pass held every publish that arrived during it behind them (issue
  31's publish tail).
* A session served for anything else (a signal, busy, unsignalled) had its connection checked
  then (the loop checks every session it serves): its check is put off to a check interval
  after that serve, not made (``deferred``). A session publishing once a second was served
  twice a second, once for its message and once for a check of what that serve had just looked
  at (issue 31: a connection check a publish). (Sessions served in one pass and quiet after
  it have their checks in one slot: the checks per pass bound spreads them over passes; a new
  session's first serve puts nothing off, its first check keeps its random point.)

Invariants: :meth:`SessionSchedule.due` returns each key at most once, only keys added and not
forgotten, in the order busy, unsignalled, signalled, checked (the last in ``checking``, at most
``max_checks_per_pass`` of them); a session that neither signals nor is busy is returned at
most once a pass and, over any span of k check intervals (its own: ``watched_interval_ns`` for a
watched session), at most k + 1 times (a late pass may bring its next check closer); every
session is served (its connection looked at) at least once every check interval of its own and
a grid slot, or as soon after as the checks per pass allow; a
pass costs O(due · log n), never O(n) for n open sessions.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Hashable

from aeron_spark.errors import ConfigurationError

CHECK_INTERVAL_NS = 1_000_000_000
# the check of a session whose connection's loss signals (``watched``): a safety net only
WATCHED_CHECK_INTERVAL_NS = 10_000_000_000
# a lost signal's re-check comes this long after it: a live receiver's next status message
# comes within its idle interval (1 s, SM_IDLE_INTERVAL_MAX_NS), a new image of one that
# subscribed again after the receiver's cool-down (1 s) and a SETUP round: 3 s leaves a lost
# status message to spare
LOST_GRACE_NS = 3_000_000_000
CHECK_GRID_NS = 100_000_000
# sessions due only for their check taken by one pass (a check was a read of its session,
# ~20-35 us; a look at its connection since the retransmission signal)
MAX_CHECKS_PER_PASS = 64


def _on_grid(at_ns: int) -> int:
    return at_ns - at_ns % CHECK_GRID_NS


class SessionSchedule:
    """The sessions to serve now. One owner thread (the loop) but for ``signalled``."""

    def __init__(
        self,
        check_interval_ns: int = CHECK_INTERVAL_NS,
        rng: random.Random | None = None,
        max_checks_per_pass: int = MAX_CHECKS_PER_PASS,
        watched_interval_ns: int | None = None,
        lost_grace_ns: int = LOST_GRACE_NS,
    ) -> None:
        """``watched_interval_ns`` None: ``WATCHED_CHECK_INTERVAL_NS``, or the check interval
        if that is longer."""
        if max_checks_per_pass < 1:
            raise ConfigurationError("max_checks_per_pass", max_checks_per_pass, "at least 1")
        if watched_interval_ns is None:
            watched_interval_ns = max(WATCHED_CHECK_INTERVAL_NS, check_interval_ns)
        if watched_interval_ns < check_interval_ns:
            raise ConfigurationError(
                "watched_interval_ns", watched_interval_ns, "at least check_interval_ns"
            )
        if lost_grace_ns < 0:
            raise ConfigurationError("lost_grace_ns", lost_grace_ns, "at least 0")
        self.check_interval_ns = check_interval_ns
        self.lost_grace_ns = lost_grace_ns
        # (key, when) of lost signals not yet taken by a pass (any thread appends)
        self.lost: deque[tuple[Hashable, int]] = deque()
        # loop-owned: each session in grace, the end of its latest grace; the heap of
        # re-checks (an entry whose end is not its session's latest is stale)
        self._grace: dict[Hashable, int] = {}
        self._rechecks: list[tuple[int, int, Hashable]] = []
        self.rechecks = 0  # re-checks made at a grace's end (tests and benchmarks)
        self.watched_interval_ns = watched_interval_ns
        # sessions whose connection's loss signals them (add(watched=True)): checked every
        # watched_interval_ns, not every check_interval_ns
        self._watched: set[Hashable] = set()
        self.max_checks_per_pass = max_checks_per_pass
        self._rng = rng if rng is not None else random.Random()
        self.signalled: deque[Hashable] = deque()
        self.busy: set[Hashable] = set()
        self.unsignalled: set[Hashable] = set()
        self._open: set[Hashable] = set()
        self._checks: list[tuple[int, int, Hashable]] = []
        self._ids = itertools.count()
        # what the loop did (tests and benchmarks): due() calls, keys returned, of those the
        # keys returned only because their check was due
        self.passes = 0
        self.served = 0
        self.checks = 0
        self.deferred = 0  # checks put off: the session was served since its last check
        # when each session was last served for something other than its check (since then)
        self._seen: dict[Hashable, int] = {}
        # added since the last pass: their first serve does not put their first check off
        # (that check falls at a random point of the first interval: the spread of the checks)
        self._added: set[Hashable] = set()
        # a wake-up of the loop is pending for what was signalled (set by the signalling
        # thread, cleared by due() before it takes the signalled keys)
        self._wake_pending = False
        # the keys the last due() returned only because their check was due
        self.checking: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: Hashable, now_ns: int, signals: bool = True, watched: bool = False) -> None:
        """A session opened: served on the next pass, then when due. ``signals``: False when
        its media cannot signal (served every pass). ``watched``: a loss of its connection
        signals it too (its transport's timeouts, its peer's end of stream): its check is a
        safety net, every ``watched_interval_ns``."""
        self._open.add(key)
        if not signals:
            self.unsignalled.add(key)
        interval = self.check_interval_ns
        if watched and signals:
            self._watched.add(key)
            interval = self.watched_interval_ns
        self.signalled.append(key)  # what arrived before it was watched
        self._added.add(key)
        first = _on_grid(now_ns + self._rng.randrange(interval))
        heapq.heappush(self._checks, (first, next(self._ids), key))

    def signal(self, key: Hashable) -> bool:
        """``key`` signalled (any thread); True when the caller must wake the loop: the first
        key since the last pass took them (a later one is taken by the pass that wake-up
        runs). A key queued after a pass cleared the flag sets it again and wakes; one that
        found it set was queued before the clear that precedes the next pass's take."""
        self.signalled.append(key)
        if self._wake_pending:
            return False
        self._wake_pending = True
        return True

    def lose(self, key: Hashable, now_ns: int) -> bool:
        """``key``'s connection may have been lost at ``now_ns`` (any thread: a driver's): a
        re-check ``lost_grace_ns`` later, the session ``in_grace`` until then (from the pass
        that takes it). True when the caller must wake the loop (as :meth:`signal`)."""
        self.lost.append((key, now_ns))
        if self._wake_pending:
            return False
        self._wake_pending = True
        return True

    def in_grace(self, key: Hashable) -> bool:
        """A lost signal's re-check is pending: the loop does not close the session for its
        connection before it."""
        return key in self._grace

    def forget(self, key: Hashable) -> None:
        """A session is gone: never returned again (its heap entry is dropped when it surfaces)."""
        self._open.discard(key)
        self._watched.discard(key)
        self.busy.discard(key)
        self.unsignalled.discard(key)
        self._seen.pop(key, None)
        self._added.discard(key)
        self._grace.pop(key, None)

    def set_busy(self, key: Hashable, busy: bool) -> None:
        """After serving it: whether it has something left to do on the next pass."""
        if busy:
            if key in self._open:
                self.busy.add(key)
        else:
            self.busy.discard(key)

    def due(self, now_ns: int) -> list[Hashable]:
        """The sessions to serve at ``now_ns``, each once."""
        self.passes += 1
        is_open = self._open
        due: dict[Hashable, None] = dict.fromkeys(self.busy)
        if self.unsignalled:
            due.update(dict.fromkeys(self.unsignalled))
        signalled = self.signalled
        self._wake_pending = False  # before the take: a key queued after it wakes again
        while signalled:
            due[signalled.popleft()] = None
        lost = self.lost
        if lost:
            grace = self._grace
            while lost:
                key, at = lost.popleft()
                if key in is_open:
                    at += self.lost_grace_ns
                    if at > grace.get(key, -1):
                        grace[key] = at
                        heapq.heappush(self._rechecks, (at, next(self._ids), key))
        # served for something other than a check (what due holds so far): when, for their
        # checks (a new session's first serve excepted; a forgotten one is not kept)
        seen = self._seen
        added = self._added
        for key in due:
            if key in is_open and key not in added:
                seen[key] = now_ns
        if added:
            added.clear()
        checks = self._checks
        watched = self._watched
        checking = self.checking = set()
        room = self.max_checks_per_pass
        while checks and checks[0][0] <= now_ns:
            at, _n, key = checks[0]
            if key not in is_open:
                heapq.heappop(checks)  # forgotten meanwhile
                continue
            interval = self.watched_interval_ns if key in watched else self.check_interval_ns
            if key not in due:
                last = seen.pop(key, None)
                if last is not None:
                    # served since its last check: its connection was looked at then, the
                    # check is a check interval after that serve (on the grid, rounded up)
                    later = last + interval
                    later += -later % CHECK_GRID_NS
                    if later > now_ns:
                        heapq.heapreplace(checks, (later, next(self._ids), key))
                        self.deferred += 1
                        continue
                if len(checking) >= room:
                    break  # the rest of the slot: the next passes, what signalled between them
            at += interval
            if at <= now_ns:  # the loop fell behind (a long pass, a clock jump): from now
                at = now_ns + interval
                if interval > CHECK_GRID_NS:
                    at = _on_grid(at)
            heapq.heapreplace(checks, (at, next(self._ids), key))
            if key not in due:
                due[key] = None
                checking.add(key)
        self.checks += len(checking)
        rechecks = self._rechecks
        if rechecks and rechecks[0][0] <= now_ns:
            grace = self._grace
            while rechecks and rechecks[0][0] <= now_ns:
                at, _n, key = heapq.heappop(rechecks)
                if grace.get(key) != at:
                    continue  # forgotten, or a later lost signal's grace ends later
                del grace[key]
                self.rechecks += 1
                if key not in due:
                    due[key] = None
                    checking.add(key)
        served = [key for key in due if key in is_open]
        self.served += len(served)
        return served

    def next_check_ns(self) -> int | None:
        """When the earliest check or re-check is due (None: none)."""
        checks = self._checks
        while checks and checks[0][2] not in self._open:
            heapq.heappop(checks)
        at = checks[0][0] if checks else None
        rechecks, grace = self._rechecks, self._grace
        while rechecks and grace.get(rechecks[0][2]) != rechecks[0][0]:
            heapq.heappop(rechecks)
        if rechecks and (at is None or rechecks[0][0] < at):
            at = rechecks[0][0]
        return at


__all__ = [
    "CHECK_GRID_NS",
    "CHECK_INTERVAL_NS",
    "LOST_GRACE_NS",
    "MAX_CHECKS_PER_PASS",
    "WATCHED_CHECK_INTERVAL_NS",
    "SessionSchedule",
]

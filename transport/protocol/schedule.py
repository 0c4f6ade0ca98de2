"""What an agent steps, and when, without walking everything it holds (issue 31 item 1):
items that have something to do now (``ready``, a deque any thread may append to) and items
waiting for a deadline (a heap), so an idle stream costs nothing until its next deadline.

Invariants:

* An item has at most one live deadline. ``schedule`` with an earlier one replaces it (the old
  heap entry goes stale: skipped when it surfaces; the heap is rebuilt when stale entries
  outnumber live ones); with a later one it keeps the earlier, so the item is stepped early,
  finds nothing due and schedules itself again (a busy stream's heartbeat deadline moves on at
  every send: one heap push per heartbeat interval, not one per send).
* :meth:`DueQueue.take` returns each item once, ready ones first in arrival order, then those
  whose deadline is at or before ``now_ns``; an item taken for its deadline has none until
  scheduled again (one taken because it was ready keeps a later one it had).
* Appending to ``ready`` is the only thing other threads do (``deque.append`` is atomic); every
  other call is the owning agent's.

Idle deadlines on a grid (``IDLE_GRID_NS``: ``now + interval`` rounded down to it, written out
where an image or a publication sets its deadline, one Python call fewer a datagram): an idle
stream's spaced-out heartbeat or status message (a channel's ``idle-heartbeat-interval`` /
``idle-sm-interval``, a second or two) is due on a multiple of ``IDLE_GRID_NS`` (20 ms), at most
that much earlier than its interval, never later, and every interval after it exactly (the
intervals are multiples of the grid). So a driver holding thousands of idle streams steps them
some fifty times a second, many in a step, instead of waking once per stream and datagram (each
wake-up costs a poll, a thread switch and a pass over the agents: most of an idle server's time
at 2,048 sessions; issue 31). Aeron's own cadences (100 ms, 200 ms) are not moved.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")

IDLE_GRID_NS = 20_000_000


class DueQueue(Generic[T]):
    """Ready items and items by deadline, for one agent (or one endpoint of it)."""

    __slots__ = ("_at", "_heap", "_seq", "ready")

    def __init__(self) -> None:
        self.ready: deque[T] = deque()
        self._heap: list[tuple[int, int, T]] = []
        self._at: dict[T, int] = {}  # item -> its live deadline
        self._seq = 0  # ties: insertion order (items need not be comparable)

    def schedule(self, item: T, deadline_ns: int) -> None:
        """Step ``item`` at ``deadline_ns``, or at the earlier deadline it has."""
        at = self._at
        current = at.get(item)
        if current is not None:
            if current <= deadline_ns:
                return
            # its later entry is left stale in the heap: the only place (with forget) one is
            # made, so the only place the heap's size is checked (two len() calls an idle
            # item's every step did for nothing; issue 31)
            if len(self._heap) > 2 * len(at) + 64:
                self._compact()
        at[item] = deadline_ns
        self._seq += 1
        heapq.heappush(self._heap, (deadline_ns, self._seq, item))

    def forget(self, item: T) -> None:
        """``item`` is gone: no deadline (a ready entry of it is the caller's to skip)."""
        if self._at.pop(item, None) is not None and len(self._heap) > 2 * len(self._at) + 64:
            self._compact()

    def take(self, now_ns: int) -> list[T]:
        """Every ready item and every item due at ``now_ns``, each once."""
        ready = self.ready
        heap = self._heap
        if not ready and (not heap or heap[0][0] > now_ns):
            return []  # the common idle step: nothing allocated but this list
        out: dict[T, None] = {}
        while ready:
            out[ready.popleft()] = None
        at = self._at
        while heap and heap[0][0] <= now_ns:
            deadline, _, item = heapq.heappop(heap)
            if at.get(item) == deadline:
                del at[item]  # taken for it: its caller schedules it again
                out[item] = None
        return list(out)

    def next_ns(self, default_ns: int) -> int:
        """The earliest live deadline (``default_ns`` if later or none); stale tops dropped.
        With ready items the answer is 0: step now."""
        if self.ready:
            return 0
        heap = self._heap
        at = self._at
        while heap and at.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        if heap and heap[0][0] < default_ns:
            return heap[0][0]
        return default_ns

    def __len__(self) -> int:
        """Items with a deadline."""
        return len(self._at)

    def _compact(self) -> None:
        at = self._at
        self._heap = [e for e in self._heap if at.get(e[2]) == e[0]]
        heapq.heapify(self._heap)

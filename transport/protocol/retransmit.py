"""Which parts of a NAKed range a publication resends (Aeron's ``aeron_retransmit_handler.c``),
sans I/O: a range, its destination and ``now_ns`` in, the pieces to resend out.

Invariants:

* A range queued or resent to a destination less than ``linger_ns`` ago is not resent to it
  again: a NAK overlapping it resends only the part not covered.
* The bytes of the ranges still lingering for one destination never exceed its receiver window
  (at least one mtu): a flood of NAKs cannot make the sender resend more than one window per
  linger. At most ``MAX_RETRANSMIT_RANGES`` ranges linger at once.
* What is not resent makes the NAK count as suppressed (``retransmits_suppressed``); the receiver
  NAKs it again later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aeron_spark.transport.protocol.tally import counter

RETRANSMIT_LINGER_NS = 10_000_000
MAX_RETRANSMIT_RANGES = 256  # lingering retransmit ranges tracked; NAKs past this wait

# resend(start, end, to) -> (datagrams queued, bytes covered from start)
Resend = Callable[[int, int, Any], tuple[int, int]]


class RetransmitHandler:
    """The lingering retransmits of one publication: (start, end, linger until, destination)."""

    # its count lives in its __dict__ (a counted attribute: tally.py)
    __slots__ = ("linger_ns", "ranges", "__dict__")
    retransmits_suppressed: int = counter()

    def __init__(self, linger_ns: int = RETRANSMIT_LINGER_NS) -> None:
        self.linger_ns = linger_ns
        # (start, end, linger until, destination address or None for all)
        self.ranges: list[tuple[int, int, int, Any]] = []
        self.retransmits_suppressed = 0

    def on_nak(
        self, start: int, end: int, to: Any, window: int, mtu: int, now_ns: int, resend: Resend
    ) -> int:
        """Resend what of ``[start, end)`` is neither lingering nor over ``to``'s budget of
        ``max(window, mtu)`` lingering bytes, through ``resend``; returns datagrams queued."""
        ranges = self.ranges
        if ranges and any(r[2] <= now_ns for r in ranges):
            ranges = self.ranges = [r for r in ranges if r[2] > now_ns]
        pieces = [(start, end)]
        lingering = 0
        for r_start, r_end, _, r_to in ranges:
            if r_to != to:
                continue
            lingering += r_end - r_start
            if r_end <= start or r_start >= end:
                continue
            cut: list[tuple[int, int]] = []
            for p_start, p_end in pieces:
                if r_end <= p_start or r_start >= p_end:
                    cut.append((p_start, p_end))
                    continue
                if p_start < r_start:
                    cut.append((p_start, r_start))
                if r_end < p_end:
                    cut.append((r_end, p_end))
            pieces = cut
        suppressed = len(pieces) != 1 or pieces[0] != (start, end)
        budget = max(window, mtu) - lingering
        queued = 0
        for p_start, p_end in pieces:
            if budget <= 0 or len(ranges) >= MAX_RETRANSMIT_RANGES:
                suppressed = True
                break
            if p_end - p_start > budget:
                p_end = p_start + budget
                suppressed = True
            count, resent = resend(p_start, p_end, to)
            if resent == 0:
                suppressed = True
                break
            queued += count
            budget -= resent
            ranges.append((p_start, p_start + resent, now_ns + self.linger_ns, to))
        if suppressed:
            self.retransmits_suppressed += 1
        return queued

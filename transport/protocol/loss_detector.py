"""Gap detection and NAK timing of one image (Aeron's ``aeron_loss_detector.c`` and
``TermGapScanner``), sans I/O: the rebuilt terms, the rebuild position, the high-water mark and
``now_ns`` in; the new rebuild position and the gaps due a NAK out.

Invariants:

* Each gap (up to ``MAX_GAPS`` of them, in order) is NAKed ``nak_delay_ns`` after it is first
  seen, then again while it stays, first after the retry interval (``nak_delay_ns * 100``, at
  least 1 ms, until NAK round trips are measured, then twice the smoothed round trip, 1 ms to
  100 ms), the interval doubling with each NAK up to 8 times that.
* A gap that shrinks or splits as retransmits land keeps its timer (the rest is on its way); a
  NAKed gap whose start moved or that is gone got its first retransmitted bytes: the time since
  its last NAK is a round-trip sample.
* A gap ends where the next out-of-order datagram was inserted (``inserted``, sorted, each
  position once, pruned below the rebuild position), so a scan reads one header per frame and
  never walks empty term; only the known gaps and the part past the last scan are scanned again.

Real Aeron NAKs only the first gap; a NAK is a NAK to its publisher, so tracking several stays
wire-compatible and recovers from heavy loss in parallel.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from typing import Any

from aeron_spark.transport.protocol.logbuffer import PARTITION_COUNT, position_bits_to_shift
from aeron_spark.transport.protocol.term import scan_for_gap

NAK_RETRY_RATIO = 100
MIN_NAK_RETRY_NS = 1_000_000
NAK_BACKOFF_MAX_SHIFT = 3  # re-NAK intervals: retry, 2x, 4x, then 8x the retry time
MAX_NAK_RETRY_NS = 100_000_000
MAX_GAPS = 64  # gaps NAKed at once (Aeron tracks one; more recovers faster under heavy loss)


class LossDetector:
    """The gaps of one image between its rebuild position and high-water mark, with their NAK
    timers: gap position -> [length, next NAK time, NAKs sent, time of the last NAK]."""

    def __init__(
        self, terms: Sequence[Any], term_length: int, join_position: int, nak_delay_ns: int
    ) -> None:
        self.terms = terms
        self.term_length = term_length
        self.term_mask = term_length - 1
        self.shift = position_bits_to_shift(term_length)
        self.nak_delay_ns = nak_delay_ns
        self.nak_retry_ns = max(nak_delay_ns * NAK_RETRY_RATIO, MIN_NAK_RETRY_NS)
        self.nak_rtt_ns = -1  # smoothed NAK -> first retransmitted bytes time; -1: no sample
        self.gaps: dict[int, list[int]] = {}
        self.gap_position = -1  # the first gap (for tests and counters); -1 when none
        self.gap_length = 0
        self.inserted: list[int] = []  # positions of datagrams inserted out of order, sorted
        self.scanned_to = join_position  # the last scan's end: beyond it nothing is known

    def note_inserted(self, position: int) -> None:
        """A datagram was written out of order at ``position`` (the first time)."""
        insort(self.inserted, position)

    def clear(self) -> None:
        """Nothing is missing (the rebuild position reached the high-water mark)."""
        if self.gaps:
            self.gaps = {}
            self.gap_position, self.gap_length = -1, 0

    def scan(self, rebuild: int, hwm: int, now_ns: int) -> int:
        """Advance ``rebuild`` over complete frames up to ``hwm`` and find up to MAX_GAPS gaps;
        returns the new rebuild position (the first gap's, else as far as complete frames go)."""
        ranges = [(p, p + e[0]) for p, e in self.gaps.items() if p + e[0] > rebuild]
        tail = self.scanned_to if self.scanned_to > rebuild else rebuild
        if tail < hwm:
            ranges.append((tail, hwm))
        found: list[tuple[int, int]] = []
        scanned_to = tail
        term_length = self.term_length
        for low, high in ranges:
            position = low if low > rebuild else rebuild
            while position < high:
                if len(found) >= MAX_GAPS:
                    break
                offset = position & self.term_mask
                term_start = position - offset
                limit = high - term_start
                if limit > term_length:
                    limit = term_length
                term = self.terms[(position >> self.shift) % PARTITION_COUNT]
                new_offset, gap_offset, length = scan_for_gap(
                    term, offset, limit, self._next_inserted(term_start)
                )
                if length:
                    gap = term_start + gap_offset
                    if found and found[-1][0] + found[-1][1] == gap:
                        found[-1] = (found[-1][0], found[-1][1] + length)  # one gap, two ranges
                    else:
                        found.append((gap, length))
                    position = gap + length
                    continue
                position = term_start + new_offset
                if new_offset < term_length:
                    break
            if len(found) >= MAX_GAPS:
                scanned_to = min(position, high)  # gaps past here are not tracked: rescan
                break
            scanned_to = max(scanned_to, position)
        self.scanned_to = scanned_to
        rebuild = found[0][0] if found else max(rebuild, scanned_to)
        inserted = self.inserted
        if inserted and inserted[0] < rebuild:
            del inserted[: bisect_left(inserted, rebuild)]
        self._schedule(found, now_ns)
        if found:
            self.gap_position, self.gap_length = found[0]
        else:
            self.gap_position, self.gap_length = -1, 0
        return rebuild

    def _next_inserted(self, term_start: int) -> Callable[[int], int]:
        """For scan_for_gap: term offset of the first datagram inserted after an offset."""
        inserted = self.inserted
        term_length = self.term_length

        def next_offset(offset: int) -> int:
            i = bisect_right(inserted, term_start + offset)
            return inserted[i] - term_start if i < len(inserted) else term_length

        return next_offset

    def _schedule(self, found: list[tuple[int, int]], now_ns: int) -> None:
        """The gaps just found (in order) keep the timer of the gap they lie in, if any; a NAKed
        gap that moved or went is a round-trip sample (see the module's invariants)."""
        old = list(self.gaps.items())
        gaps: dict[int, list[int]] = {}
        i = 0
        for gap_position, length in found:
            while i < len(old) and old[i][0] + old[i][1][0] <= gap_position:
                i += 1
            if i < len(old) and old[i][0] <= gap_position:
                entry = old[i][1]
                gaps[gap_position] = [length, *entry[1:]]
            else:
                gaps[gap_position] = [length, now_ns + self.nak_delay_ns, 0, 0]
        for gap_position, entry in old:
            if entry[2] and gap_position not in gaps:
                sample = now_ns - entry[3]
                rtt = self.nak_rtt_ns
                self.nak_rtt_ns = sample if rtt < 0 else rtt + (sample - rtt) // 8
                retry = max(2 * self.nak_rtt_ns, MIN_NAK_RETRY_NS)
                self.nak_retry_ns = min(retry, MAX_NAK_RETRY_NS)
        self.gaps = gaps

    def due(self, now_ns: int) -> list[tuple[int, list[int]]]:
        """The gaps whose NAK (or fill) is due, in order: (position, entry)."""
        return [(p, e) for p, e in self.gaps.items() if now_ns >= e[1]]

    def on_nak_sent(self, entry: list[int], now_ns: int) -> None:
        """A gap was NAKed: its next NAK after the retry interval, doubled per NAK (capped)."""
        entry[1] = now_ns + (self.nak_retry_ns << min(entry[2], NAK_BACKOFF_MAX_SHIFT))
        entry[2] += 1
        entry[3] = now_ns

    def filled(self, position: int) -> None:
        """The gap at ``position`` was filled with padding (an unreliable image)."""
        del self.gaps[position]

    def next_deadline_ns(self, deadline: int) -> int:
        """The earlier of ``deadline`` and the next NAK due."""
        for entry in self.gaps.values():
            if entry[1] < deadline:
                deadline = entry[1]
        return deadline

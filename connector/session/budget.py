"""One read budget shared between many recording ranges, written once (issue 31 item 2).

The stream server answers ``scan_ranges`` with it (one request for many recordings, its ``scan``
over each range); the source uses it for a store without such a request (an archive: one scan
per range) and for recordings on several servers. Evenly between the ranges with data first,
then what is left goes to those with more, in the order given, so one recording's backlog never
starves the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# scan(index, start, target, max_messages, max_bytes) -> (end, messages): the furthest message
# boundary in (start, target] within the budget (None: no bound); messages -1: not counted
ScanOne = Callable[[int, int, int, int | None, int | None], tuple[int, int]]


def share_budget(
    ranges: Sequence[tuple[int, int]],
    max_messages: int | None,
    max_bytes: int | None,
    scan: ScanOne,
) -> list[tuple[int, int]]:
    """``(end, messages)`` per ``(start, target)`` of ``ranges``: each end a message boundary in
    ``[start, target]``, the whole messages in ``[start, end)`` (-1: a scan did not count)."""
    ends = [int(start) for start, _ in ranges]
    counts = [0] * len(ranges)
    waiting = [i for i, (start, target) in enumerate(ranges) if target > start]
    messages_left, bytes_left = max_messages, max_bytes
    for rounds in (0, 1):
        if not waiting:
            break
        share_messages = None if messages_left is None else max(1, messages_left // len(waiting))
        share_bytes = None if bytes_left is None else max(1, bytes_left // len(waiting))
        for i in list(waiting):
            if messages_left is not None and messages_left <= 0:
                break
            if bytes_left is not None and bytes_left <= 0:
                break
            target = int(ranges[i][1])
            end, messages = scan(
                i,
                ends[i],
                target,
                messages_left if rounds else share_messages,
                bytes_left if rounds else share_bytes,
            )
            if messages < 0 or counts[i] < 0:  # not counted: no budget, nothing was read
                counts[i] = -1
            else:
                counts[i] += messages
            if messages_left is not None:
                messages_left -= max(0, messages)
            if bytes_left is not None:
                bytes_left -= end - ends[i]
            ends[i] = end
            if end >= target or messages == 0:
                waiting.remove(i)
    return list(zip(ends, counts, strict=True))


__all__ = ["ScanOne", "share_budget"]

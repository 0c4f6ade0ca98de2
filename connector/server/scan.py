"""Message boundaries of a recording range: the server side of the source's admission control.

``scan(cursor, start, ...)`` walks frame headers from ``start`` (a message boundary) and answers:

* ``end``: the furthest position that ends a whole message and keeps within ``max_messages`` /
  ``max_bytes`` (at least one message when any is complete, so a query always progresses);
  never inside a fragmented message, so a micro-batch never tears one;
* ``messages``: whole messages in ``[start, end)``;
* ``splits``: up to ``parts - 1`` positions inside ``(start, end)``, each a message boundary,
  cutting the range into parts of about equal message counts (the source's ``minPartitions``).

PAD frames (term ends) carry no message and count toward bytes only. Only headers are read (frame
length, flags, type), block by block through the store's replay cursor.
"""

from __future__ import annotations

from array import array
from typing import Any

from aeron_spark.transport.protocol.frames import (
    FRAME_ALIGNMENT,
    HEADER,
    DataFlags,
    FrameType,
    uniform_run,
)

_END_FLAG = int(DataFlags.END)
_ALIGN = FRAME_ALIGNMENT
_BLOCK_BYTES = 4 * 1024 * 1024
_PAD = int(FrameType.PAD)
_DATA = int(FrameType.DATA)
_UNFRAGMENTED = int(DataFlags.UNFRAGMENTED)


def scan(
    cursor: Any,
    start: int,
    *,
    max_messages: int | None = None,
    max_bytes: int | None = None,
    parts: int = 1,
    now_ns: int = 0,
) -> dict[str, Any]:
    boundaries = array("q")  # position after each whole message, in order
    last_boundary = start
    messages = 0
    done = False
    unpack = HEADER.unpack_from
    while not done:
        block = cursor.read(_BLOCK_BYTES, now_ns)
        if block is None:
            break
        position, _end, _ts, frames = block
        offset, length = 0, len(frames)
        while offset < length:
            frame_length, _v, flags, kind = unpack(frames, offset)
            if flags == _UNFRAGMENTED and kind == _DATA and frame_length > 0:
                # A run of equal-length whole messages (the common case) is taken at once.
                aligned = (frame_length + _ALIGN - 1) & ~(_ALIGN - 1)
                run = uniform_run(frames, offset, frame_length)
                if run > 1:
                    base = position + offset
                    if max_messages is not None:
                        run = min(run, max_messages - messages)
                    if max_bytes is not None:
                        fit = (start + max_bytes - base) // aligned
                        run = min(run, fit if fit > 0 or messages else 1)
                    if run > 0:
                        stop = base + (run + 1) * aligned
                        boundaries.extend(range(base + aligned, stop, aligned))
                        messages += run
                        last_boundary = base + run * aligned
                        offset += run * aligned
                    if (max_messages is not None and messages >= max_messages) or (
                        max_bytes is not None
                        and offset < length
                        and last_boundary + aligned - start > max_bytes
                    ):
                        done = True
                        break
                    continue
            if frame_length <= 0:
                break  # nothing more is written (cannot happen below the visible end)
            aligned = (frame_length + _ALIGN - 1) & ~(_ALIGN - 1)
            after = position + offset + aligned
            if kind == _PAD:
                if last_boundary == position + offset:  # padding between messages
                    last_boundary = after
            elif flags & _END_FLAG:
                if max_bytes is not None and messages and after - start > max_bytes:
                    done = True
                    break
                messages += 1
                last_boundary = after
                boundaries.append(after)
                if max_messages is not None and messages >= max_messages:
                    done = True
                    break
            offset += aligned
    cursor.close()
    splits: list[int] = []
    if parts > 1 and messages > 1:
        step = messages / min(parts, messages)
        index = step
        while len(splits) < min(parts, messages) - 1:
            split = boundaries[int(round(index)) - 1]
            if split < last_boundary and (not splits or split > splits[-1]):
                splits.append(split)
            index += step
    return {"end": last_boundary, "messages": messages, "splits": splits}


__all__ = ["scan"]

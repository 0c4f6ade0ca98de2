"""Replay blocks: what a replay (over a session or read from the server's files) yields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplayBlock:
    """Raw recorded Aeron DATA frames covering ``[position, end_position)`` of a recording.

    ``data`` holds whole frames exactly as recorded, PAD frames removed (so ``len(data)`` can be
    less than ``end_position - position``). ``timestamp_ns`` is the record time of every message
    in the block (the server ends a block before the next entry of its time index).
    """

    position: int
    data: bytes | memoryview
    timestamp_ns: int
    end_position: int


__all__ = ["ReplayBlock"]

"""Filter pushdown for batch reads of a stream server (``spark.read.format("aeron")``).

Spark (with ``spark.sql.python.filterPushdown.enabled=true``) hands the reader the conjuncts of a
query's ``WHERE``; :class:`Pushed` keeps those the store can answer on the metadata columns:
``recording_id`` / ``session_id`` / ``stream_id`` equality and ``IN`` (drop whole recordings),
``position`` ranges (cut each recording's range; a bound that is not a message start is probed
with one ``scan`` and, if it is no boundary, not used) and ``timestamp`` ranges (through the
server's time index, ``position_at``, as ``startingTimestamp`` does). Every filter is still
returned to Spark, which applies it to the rows read: pushing only narrows what is read, so a
bound the store answers loosely costs rows, never correctness.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from aeron_spark.transport.protocol.frames import DataFlags

_SETS = ("recording_id", "session_id", "stream_id")
_FLAG_BEGIN = int(DataFlags.BEGIN)  # a DATA frame header's flags (byte 5): a first fragment
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _int_values(values: Iterable[Any]) -> frozenset[int] | None:
    out = set()
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            return None
        out.add(v)
    return frozenset(out)


def _micros(value: Any) -> int | None:
    """Epoch microseconds of a timestamp literal (an aware datetime; naive ones are not pushed,
    their zone being Spark's to decide)."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // dt.timedelta(microseconds=1)


@dataclass
class Pushed:
    """What a batch read was told to keep (the AND of the pushed filters)."""

    sets: dict[str, frozenset[int]] = field(default_factory=dict)
    # position bounds: (value, strict); lows are > / >=, highs < / <=
    position_low: tuple[int, bool] | None = None
    position_high: tuple[int, bool] | None = None
    # timestamp bounds in ns for position_at: rows recorded at or after ts_from, before ts_to
    ts_from_ns: int | None = None
    ts_to_ns: int | None = None

    def push(self, f: Filter) -> bool:
        """Record ``f`` if the store can narrow by it; True when it did."""
        attribute = getattr(f, "attribute", None)  # Not(...) has a child filter instead
        if attribute is None or len(attribute) != 1:
            return False
        column = str(attribute[0]).lower()
        if column in _SETS and isinstance(f, EqualTo | In):
            values = _int_values(f.value if isinstance(f, In) else (f.value,))
            if values is None:
                return False
            old = self.sets.get(column)
            self.sets[column] = values if old is None else old & values
            return True
        ops = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
        if not isinstance(f, ops):
            return False
        if column == "position":
            if not isinstance(f.value, int) or isinstance(f.value, bool):
                return False
            v = f.value
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                low = (v, isinstance(f, GreaterThan))
                if self.position_low is None or low > self.position_low:
                    self.position_low = low
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                high = (v, not isinstance(f, LessThan))  # (value, inclusive)
                if self.position_high is None or high < self.position_high:
                    self.position_high = high
            return True
        if column == "timestamp":
            us = _micros(f.value)
            if us is None:
                return False
            # The column is the recorded ns // 1000: ts >= T  <=>  ns >= T * 1000.
            if isinstance(f, GreaterThanOrEqual | EqualTo | GreaterThan):
                start = (us + (1 if isinstance(f, GreaterThan) else 0)) * 1000
                self.ts_from_ns = max(self.ts_from_ns or 0, start)
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                stop = (us + (0 if isinstance(f, LessThan) else 1)) * 1000
                self.ts_to_ns = stop if self.ts_to_ns is None else min(self.ts_to_ns, stop)
            return True
        return False

    @property
    def empty(self) -> bool:
        return (
            not self.sets
            and self.position_low is None
            and self.position_high is None
            and (self.ts_from_ns is None and self.ts_to_ns is None)
        )

    def keeps(self, info: Any) -> bool:
        """Whether a recording (a store's ``Recording``) may hold matching rows."""
        return all(getattr(info, column) in values for column, values in self.sets.items())

    def narrow(self, client: Any, recording_id: int, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` (message boundaries) cut to the pushed position and time bounds;
        still message boundaries (start == end when nothing can match)."""
        if self.ts_from_ns is not None:
            start = max(start, client.position_at(recording_id, self.ts_from_ns))
        if self.ts_to_ns is not None:
            end = min(end, client.position_at(recording_id, self.ts_to_ns))
        if self.position_low is not None and start < end:
            value, strict = self.position_low
            if value >= end or (strict and value + 1 >= end):
                return start, start
            if value > start or (strict and value == start):
                cut = _message_bound(client, recording_id, value, end, after=strict)
                if cut is not None:
                    start = max(start, cut)
        if self.position_high is not None and start < end:
            value, inclusive = self.position_high
            if value < start or (value == start and not inclusive):
                return start, start
            if value < end:
                cut = _message_bound(client, recording_id, value, end, after=inclusive)
                if cut is not None:
                    end = min(end, cut)
        return start, max(start, end)


def _message_bound(
    client: Any, recording_id: int, position: int, end: int, *, after: bool
) -> int | None:
    """``position`` when a message starts there (or the end of that message with ``after``);
    None when no message starts there (the bound is then not used: Spark still filters)."""
    try:
        got = client.scan(recording_id, position, end, max_messages=1)
        # scan takes a middle fragment for a start: the first frame must BEGIN a message
        first = b"".join(bytes(b.data) for b in client.replay(recording_id, position, got.end))
    except Exception:  # noqa: BLE001 - not a frame boundary (or gone): narrow less
        return None
    if first and not first[5] & _FLAG_BEGIN:
        return None
    return int(got.end) if after else position


def push_filters(pushed: Pushed, filters: Iterable[Filter]) -> list[Filter]:
    """Record what can be pushed; every filter goes back to Spark (see the module docstring)."""
    out = list(filters)
    for f in out:
        pushed.push(f)
    return out

"""The server's view of its recordings, kept up to date with work proportional to what changed
(issue 31 item 4: with 10,000 recordings, every listing sorted and copied all of them and the
``stat.json`` snapshot re-encoded the whole catalog every second on the loop).

- An index: recordings by id (in order) and by stream, extended with the recordings created
  since the last look (ids only grow; nothing is removed), so a listing of one stream touches
  only that stream's recordings.
- What may still change: only a recording that is live (not stopped, or a sink recording, or one
  whose stop file is not yet written) changes by itself; a stopped one only when purged, which
  :meth:`Catalog.touch` marks. :meth:`Catalog.refresh` re-reads those, nothing else.
- The snapshot's recordings section as JSON text, re-encoded per recording that changed, joined
  again only when one did; the streams' totals kept by deltas; the recordings' counters summed
  over the live ones plus what stopped ones held when they stopped.

Thread use: the index is extended under a lock (the loop and the commit worker both list);
:meth:`refresh` runs under a lock of its own (the loop's snapshot and ``list_streams``, a
caller's ``StreamServer.snapshot()``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from aeron_spark.transport.archive import Recording

_COUNTERS = ("short_writes", "failed_appends", "cut_failures", "stop_pending")


class _Entry:
    __slots__ = ("rec", "state", "text", "info")

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.state: tuple[int, int, int | None] | None = None
        self.text = ""
        self.info: dict[str, Any] = {}


class Catalog:
    """An incrementally maintained index and snapshot of ``recordings`` (the archive's dict,
    id -> :class:`Recording`). ``info(rec)`` describes one recording as the protocol does."""

    def __init__(
        self,
        recordings: dict[int, Recording],
        info: Callable[[Recording], dict[str, Any]],
        is_live: Callable[[Recording], bool],
        shown: frozenset[int] | None = None,
    ) -> None:
        """``shown``: the streams the snapshot shows (the server's ``allowed_stream_ids``;
        None: all)."""
        self._recordings = recordings
        self._shown = shown
        self._info = info
        self._is_live = is_live
        self._lock = threading.Lock()
        # refresh and the state it updates: the loop's snapshot, its list_streams and a caller's
        # StreamServer.snapshot() on another thread
        self._refreshing = threading.RLock()
        self._seen = 0  # how many of the dict's entries are indexed
        self._ids: list[int] = []  # every recording id, in order
        self._by_id: dict[int, Recording] = {}
        self._by_stream: dict[int, list[int]] = {}  # stream -> its recording ids, in order
        self._unadopted: list[int] = []  # indexed, not yet in the snapshot's state
        # the snapshot's state (the loop's): per recording its encoded description
        self._entries: dict[int, _Entry] = {}
        self._live: set[int] = set()
        self._touched: set[int] = set()
        self._streams: dict[int, list[int]] = {}  # stream -> [recordings, active, bytes]
        self._frozen = dict.fromkeys(_COUNTERS, 0)  # counters of recordings that stopped
        self._text: str | None = "[]"  # the joined recordings section (None: join again)
        # refresh_some's round: what is left of it to re-read (None: no round under way)
        self._round: list[int] | None = None
        self.refreshed = 0  # recordings re-read by refresh (for tests and benchmarks)

    # --- the index ----------------------------------------------------------------------------

    def _sync(self) -> None:
        """Index the recordings created since the last call (the snapshot adopts them later)."""
        recordings = self._recordings
        if len(recordings) == self._seen:
            return
        with self._lock:
            # a C-level copy of the new tail (the dict only grows, in creation order)
            new = sorted(list(itertools.islice(recordings.values(), self._seen, None)), key=_rid)
            self._seen += len(new)
            for rec in new:
                rid = rec.d.recording_id
                self._by_id[rid] = rec
                _insert(self._ids, rid)
                _insert(self._by_stream.setdefault(rec.d.stream_id, []), rid)
                self._unadopted.append(rid)

    def recordings(self, stream_ids: Iterable[int] | None = None) -> list[Recording]:
        """The recordings of ``stream_ids`` (None: all), by id."""
        self._sync()
        by_id = self._by_id
        if stream_ids is None:
            return [by_id[rid] for rid in self._ids]
        lists = [self._by_stream.get(s, []) for s in set(stream_ids)]
        ids = lists[0] if len(lists) == 1 else sorted(itertools.chain.from_iterable(lists))
        return [by_id[rid] for rid in ids]

    def stream_of(self, recording_id: int) -> int | None:
        self._sync()
        rec = self._by_id.get(recording_id)
        return None if rec is None else rec.d.stream_id

    def touch(self, recording_id: int) -> None:
        """A stopped recording changed (purged): the next :meth:`refresh` re-reads it."""
        with self._lock:  # purges run on the commit worker
            self._touched.add(recording_id)

    # --- the snapshot (the loop's) ------------------------------------------------------------

    def _adopt(self) -> None:
        """Take the recordings created since the last look into the snapshot's state."""
        self._sync()
        if not self._unadopted:
            return
        with self._lock:
            new, self._unadopted = self._unadopted, []
        for rid in new:
            rec = self._by_id[rid]
            self._entries[rid] = _Entry(rec)
            self._live.add(rid)
            # counted by its stream when first read (_refresh), as it is first listed then: a
            # snapshot's streams and recordings sections never disagree about it
            self._streams.setdefault(rec.d.stream_id, [0, 0, 0])

    def refresh(self) -> int:
        """Re-read what may have changed since the last call; how many descriptions changed."""
        with self._refreshing:
            return self._refresh()

    def refresh_some(self, limit: int) -> bool:
        """:meth:`refresh` a part at a time (the loop's snapshot: one part a pass): a round
        re-reads what may have changed as of its first call, at most ``limit`` recordings a
        call; True when the round is done. Each recording's description and its stream's
        totals change together, so the sections read between two calls still agree (at 2,048
        live recordings the whole re-read held the loop ~40 ms, every publish behind it:
        issue 31's publish tail)."""
        with self._refreshing:
            if self._round is None:
                self._adopt()
                todo = set(self._live)
                if self._touched:
                    with self._lock:
                        touched, self._touched = self._touched, set()
                    todo |= touched
                self._round = sorted(todo, reverse=True)  # taken from the end: by id
            batch = self._round[-limit:]
            del self._round[-limit:]
            self._reread(batch)
            if self._round:
                return False
            self._round = None
            return True

    def current_streams(self) -> list[dict[str, Any]]:
        """The ``streams`` section as of now (``list_streams``): a refresh (the live and the
        touched recordings re-read), then the totals kept by deltas; any thread."""
        with self._refreshing:
            self._refresh()
            return self.streams()

    def _refresh(self) -> int:
        self._adopt()
        todo: Iterable[int] = self._live
        if self._touched:
            with self._lock:
                touched, self._touched = self._touched, set()
            todo = self._live | touched
        return self._reread(todo)

    def _reread(self, todo: Iterable[int]) -> int:
        """Re-read the recordings ``todo`` names; how many descriptions changed."""
        changed = 0
        stopped = []
        for rid in todo:
            entry = self._entries.get(rid)
            if entry is None:
                continue
            rec = entry.rec
            self.refreshed += 1
            # asked before reading: once it says stopped, what is read next is final
            ended = rid in self._live and not self._is_live(rec)
            info = self._info(rec)
            state = (info["recorded_position"], info["purged_position"], info["stop_position"])
            if state != entry.state:
                stats = self._streams[rec.d.stream_id]
                if entry.state is None:
                    stats[0] += 1  # first read: counted and listed from now on
                else:
                    stats[1] -= entry.info["stop_position"] is None
                    stats[2] -= entry.info["recorded_position"] - entry.info["purged_position"]
                stats[1] += info["stop_position"] is None
                stats[2] += info["recorded_position"] - info["purged_position"]
                entry.state, entry.info = state, info
                entry.text = json.dumps(info, default=str)
                self._text = None
                changed += 1
            if ended:
                stopped.append(rid)
        for rid in stopped:  # from now on it changes only when purged (touch)
            self._live.discard(rid)
            rec = self._entries[rid].rec
            for name in _COUNTERS:
                self._frozen[name] += int(getattr(rec, name))
        return changed

    def recordings_json(self) -> str:
        """The snapshot's ``recordings`` section (JSON text), as of the last :meth:`refresh`."""
        if self._text is None:
            entries, shown = self._entries, self._shown
            self._text = (
                "["
                + ",".join(
                    entries[rid].text
                    for rid in self._ids
                    if rid in entries
                    and entries[rid].text
                    and (shown is None or entries[rid].rec.d.stream_id in shown)
                )
                + "]"
            )
        return self._text

    def streams(self) -> list[dict[str, Any]]:
        """The snapshot's ``streams`` section, as of the last :meth:`refresh`."""
        return [
            {"stream_id": s, "recordings": v[0], "active_recordings": v[1], "bytes": v[2]}
            for s, v in sorted(self._streams.items())
            if v[0] and (self._shown is None or s in self._shown)  # v[0]: none read yet
        ]

    def counters(self) -> dict[str, int]:
        """The recordings' own counters summed (``stops_pending`` named as the archive does),
        over the live ones plus what the stopped ones held when they stopped."""
        self._adopt()
        totals = dict(self._frozen)
        entries = self._entries
        for rid in self._live:
            rec = entries[rid].rec
            for name in _COUNTERS:
                totals[name] += int(getattr(rec, name))
        totals["stops_pending"] = totals.pop("stop_pending")
        return totals


def _rid(rec: Recording) -> int:
    return rec.d.recording_id


def _insert(ids: list[int], rid: int) -> None:
    if not ids or rid > ids[-1]:
        ids.append(rid)
    else:  # created concurrently and inserted out of order
        bisect.insort(ids, rid)


__all__ = ["Catalog"]

"""The stream server as a :class:`~aeron_spark.connector.stores.LogStore`.

Offset keys are ``"<recording_id>"`` (``"<endpoint>/<recording_id>"`` when the source reads
several servers). Scans and splits are the server's ``scan`` (it walks frame headers from a
message boundary); a task reads its range from the server's segment files when its process sees
them (:mod:`~aeron_spark.connector.local`, the server checks the range), else replays it over its
session. The server keeps a time index (``position_at``), answers pushed filters
(:mod:`~aeron_spark.connector.pushdown`) and keeps consumers' positions for its retention.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from aeron_spark.connector.client import ClientSettings, StreamClient, pooled
from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.pushdown import Pushed
from aeron_spark.connector.session.protocol import MAX_POSITIONS
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.stores import Budget, Features, Recording, RecordingRange, scan_each

log = logging.getLogger("aeron_spark.connector.source")


@dataclass(frozen=True)
class ServerRange(RecordingRange):
    """A stream server's range: read from its files when this process sees them."""

    local_reads: bool = True


@dataclass(frozen=True, slots=True)
class ServerSession:
    store: ServerStore
    client: StreamClient

    def recordings(self, stream_ids: tuple[int, ...]) -> list[Recording]:
        out = []
        for r in self.client.list_recordings(stream_ids=list(stream_ids)):
            key = str(r.recording_id)
            if self.store.keyed_by_endpoint:
                key = f"{self.store.settings.endpoint}/{r.recording_id}"
            out.append(
                Recording(
                    key,
                    self.store,
                    r.recording_id,
                    r.stream_id,
                    r.session_id,
                    r.initial_term_id,
                    r.term_length,
                    r.mtu,
                    r.start_position,
                    r.purged_position,
                    # a read ends on a message boundary: an ingest recording's recorded end may
                    # be inside a message still coming in
                    r.recorded_position if r.message_end is None else r.message_end,
                    r.start_timestamp_ns,
                )
            )
        return out

    def scan(self, rec: Recording, start: int, target: int, budget: Budget) -> tuple[int, int]:
        got = self.client.scan(
            rec.recording_id, start, target, max_messages=budget.messages, max_bytes=budget.bytes
        )
        return got.end, got.messages

    def scan_ranges(
        self, ranges: list[tuple[Recording, int, int]], budget: Budget
    ) -> list[tuple[int, int]]:
        """One ``scan_ranges`` request (the server shares the budget as :func:`scan_each`
        would); a scan per range from a server without it, or past what one request carries."""
        if len(ranges) <= MAX_POSITIONS:
            try:
                return self.client.scan_ranges(
                    [(rec.recording_id, start, target) for rec, start, target in ranges],
                    max_messages=budget.messages,
                    max_bytes=budget.bytes,
                )
            except ControlProtocolError:
                pass  # a server before the request: one scan each
        return scan_each(self, ranges, budget)

    def message_ends(self, recs: list[Recording]) -> dict[str, int] | None:
        """One ``recording_positions`` request for all of ``recs`` (issue 31 item 3: a scan per
        recording took 10-21 s at 10,000 recordings); None from a server without it."""
        try:
            found = self.client.recording_positions(sorted({r.stream_id for r in recs}))
        except ControlProtocolError:
            return None  # a server before the request: the reader scans
        return {r.key: found[r.recording_id].message_end for r in recs if r.recording_id in found}

    @contextmanager
    def replay(self, rec: Recording, start: int, end: int) -> Iterator[Iterator[ReplayBlock]]:
        yield self.client.replay(rec.recording_id, start, end)

    def position_at(self, rec: Recording, timestamp_ns: int) -> int:
        return self.client.position_at(rec.recording_id, timestamp_ns)

    def narrow(self, pushed: Pushed, rec: Recording, start: int, end: int) -> tuple[int, int]:
        return pushed.narrow(self.client, rec.recording_id, start, end)

    def commit_consumer(
        self, consumer_id: str, stream_ids: tuple[int, ...], positions: dict[str, int]
    ) -> None:
        mine: dict[int, int] = {}
        for key, pos in positions.items():
            endpoint, _, rid = key.rpartition("/")
            if (endpoint or self.store.settings.endpoint) == self.store.settings.endpoint:
                mine[int(rid)] = pos
        self.client.consumer_commit(consumer_id, stream_ids, mine)


@dataclass(frozen=True, slots=True)
class ServerStore(Features):
    """One stream server (``settings.endpoint``) of a source."""

    settings: ClientSettings
    local_reads: bool = True
    keyed_by_endpoint: bool = False  # the source reads several servers
    name = "stream server"
    time_index = True
    pushdown = True
    consumers = True

    @contextmanager
    def session(self) -> Iterator[ServerSession]:
        with pooled(self.settings) as client:  # Python workers are reused: so are sessions
            yield ServerSession(self, client)

    def partition(self, rec: Recording, start: int, end: int, text: bool) -> ServerRange:
        return ServerRange.of(self, rec, start, end, text, local_reads=self.local_reads)

    def split(self, part: RecordingRange, shares: int) -> list[RecordingRange]:
        """Cut at the message boundaries the server finds (``scan`` with ``parts``)."""
        with pooled(self.settings) as client:
            splits = client.scan(part.recording_id, part.start, part.end, parts=shares).splits
        bounds = [part.start, *splits, part.end]
        return [
            dataclasses.replace(part, start=a, end=b)
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        ]

    @contextmanager
    def read(self, part: RecordingRange) -> Iterator[Iterator[ReplayBlock]]:
        local = part.local_reads if isinstance(part, ServerRange) else True
        with pooled(self.settings) as client:
            yield client.read_range(part.recording_id, part.start, part.end, local=local)

    @contextmanager
    def read_many(
        self, parts: Sequence[RecordingRange]
    ) -> Iterator[Iterator[Iterator[ReplayBlock]]]:
        """Every part in one request (``local_read_ranges``, else one ``replay_ranges``): a
        packed partition of many small recordings paid a request (a round trip through the
        server's loop) a range."""
        local = all(p.local_reads if isinstance(p, ServerRange) else True for p in parts)
        with pooled(self.settings) as client:
            each = client.read_ranges(
                [(p.recording_id, p.start, p.end) for p in parts], local=local
            )
            try:
                yield each
            finally:
                close = getattr(each, "close", None)
                if close is not None:
                    close()

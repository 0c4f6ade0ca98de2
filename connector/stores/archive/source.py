"""An Aeron Archive as a :class:`~aeron_spark.connector.stores.LogStore`.

``spark.read/readStream.format("aeron").option("archive", "aeron:udp?endpoint=host:8010")
.option("streamId", 1001)`` (optionally ``.option("channel", "<fragment>")``) reads every
recording of that stream the archive holds (whose channel contains the fragment):

* offset keys are ``"<archiveId>/<recordingId>"``; a recording's end is the recording position
  of an active recording and the stop position of a stopped one; for an archive sink's target,
  the end of its last committed batch (read-committed, :mod:`...archive_markers`);
* message boundaries (``scan``) are found by replaying from the batch start on the driver and
  stopping at the budget; an unlimited scan reads nothing and counts nothing;
* ``split`` cuts a range into as many shares as asked, proportionally to their bytes, each task
  taking the messages that *begin* in its share: a share's replay starts at the term boundary at
  or below it (every term starts with a frame), so a task reads at most one term more than its
  share;
* each task opens its own control session and a bounded replay of exactly its range (to its
  own subscription port, so its own replay session), writes the recording's session id back
  over the replay's in every frame; a retried task reads the same bytes and returns the same
  rows. A replay that stalls or an archive that goes away fails the task within ``timeoutMs``.

The ``timestamp`` column holds the recording's start time: an Aeron Archive keeps no time per
message (no time index), no consumer positions, and answers no pushed filters.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aeron_spark.connector.archive_markers import (
    END,
    TARGET_ALIAS_PREFIX,
    frames,
    is_sink_target,
    mask_markers,
    read_tail,
)
from aeron_spark.connector.options import ArchiveConnect
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.stores import (
    Budget,
    Features,
    LogStore,
    Recording,
    RecordingRange,
    scan_each,
)
from aeron_spark.connector.stores.archive.hooks import ArchiveHooks
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client import ArchiveClient
from aeron_spark.transport.archive.client.client import ReplayedBlock
from aeron_spark.transport.protocol.frames import FRAME_ALIGNMENT, DataFlags

_FLAG_BEGIN, _FLAG_END = int(DataFlags.BEGIN), int(DataFlags.END)

log = logging.getLogger("aeron_spark.connector.stores.archive")


def connect(c: ArchiveConnect, **timeouts: Any) -> ArchiveClient:
    """A control session with the archive ``c`` names (the source's and the sink's);
    ``timeouts``: more :class:`ArchiveClientConfig` settings (``connect_timeout_s``, ...)."""
    return ArchiveClient.connect(
        c.control_channel,
        control_stream_id=c.control_stream_id,
        response_host=c.response_host,
        timeout_s=c.timeout_s,
        credentials=c.credentials,
        **timeouts,
    )


_TYPE_PAD = 0x00


def distinct_archives(option: str, ids: dict[str, int]) -> None:
    """Refuse control channels that reach one archive (``ids``: each channel's archive id, as
    the archive answers it): two spellings of one archive (a host name and its address, a
    parameter more) would count it twice as a replica, so a batch held by that archive alone
    would pass for one held by ``minInSyncReplicas`` archives."""
    first: dict[int, str] = {}
    for channel, archive_id in ids.items():
        if archive_id in first:
            raise ConfigurationError(
                option,
                f"{first[archive_id]},{channel}",
                f"distinct archives (both reach archive id {archive_id})",
            )
        first[archive_id] = channel


@dataclass(frozen=True)
class ArchiveRange(RecordingRange):
    """The messages of a recording that begin in ``[start, end)``, replayed from the archive up
    to ``limit`` (``end`` itself when ``exact``: both ends are message boundaries)."""

    session_id: int = 0
    stream_id: int = 0
    limit: int = 0
    exact: bool = True
    timestamp_ns: int = 0
    sink_target: bool = False  # an archive sink's target: its marker frames are not rows
    # where the replay starts when ``start`` is not a frame boundary (a share of a split range):
    # the term boundary at or below ``start``; None: ``start``
    replay_from: int | None = None

    @classmethod
    def exact_of(
        cls, store: LogStore, rec: Recording, start: int, end: int, text: bool, **more: Any
    ) -> Any:
        """A range of ``rec`` replayed up to ``end`` exactly (``more``: a subclass's fields)."""
        return cls.of(
            store,
            rec,
            start,
            end,
            text,
            session_id=rec.session_id,
            stream_id=rec.stream_id,
            limit=end,
            exact=True,
            timestamp_ns=rec.timestamp_ns,
            sink_target=rec.committed_only,
            **more,
        )


def _target_alias(original_channel: str) -> str:
    """The sink's alias of a target's channel (``...|alias=aeron-spark-sink-<hash>``)."""
    tail = original_channel.split(f"alias={TARGET_ALIAS_PREFIX}", 1)[1]
    return TARGET_ALIAS_PREFIX + tail.split("|", 1)[0]


def _without_markers(blocks: Iterable[ReplayedBlock]) -> Iterator[ReplayedBlock]:
    """The archive sink's BEGIN/END marker frames turned into padding (not rows)."""
    for b in blocks:
        data, masked = mask_markers(b.data)
        yield b if not masked else ReplayedBlock(b.position, data, b.end_position)


def owned(blocks: Iterable[ReplayedBlock], p: ArchiveRange) -> Iterator[ReplayedBlock]:
    """The frames of the messages that begin in ``[p.start, p.end)``: leading fragments of a
    message begun before ``start`` are dropped, and reading stops after the last message that
    began before ``end`` is complete."""
    started = p.start == 0
    open_message = False
    for block in blocks:
        first = last = None
        done = False
        for at, aligned, _length, flags, ftype in frames(block.data):
            position = block.position + at
            if position < p.start:  # replayed from the term boundary below the share
                continue
            if ftype == _TYPE_PAD:
                if first is not None:
                    last = at + aligned
                continue
            if not started:
                if not flags & _FLAG_BEGIN:
                    continue
                started = True
            if flags & _FLAG_BEGIN:
                if position >= p.end:
                    done = True
                    break
                open_message = not flags & _FLAG_END
            elif flags & _FLAG_END:
                open_message = False
            if first is None:
                first = at
            last = at + aligned
        if first is not None and last is not None:
            yield ReplayedBlock(
                block.position + first, block.data[first:last], block.position + last
            )
        if done or (started and not open_message and block.end_position >= p.end):
            return


def from_message_start(blocks: Iterable[ReplayedBlock]) -> Iterator[ReplayedBlock]:
    """``blocks`` without the fragments of a message begun before them (DATA frames before the
    first BEGIN fragment): what a recording that begins inside a message (an image that joined
    late, a copy of such a recording) holds first. A replay from a message boundary starts with a
    BEGIN (or padding): nothing is dropped."""
    it = iter(blocks)
    for block in it:
        first = None
        for at, _aligned, _length, flags, ftype in frames(block.data):
            if ftype != _TYPE_PAD and flags & _FLAG_BEGIN:
                first = at
                break
        if first is None:
            continue  # fragments of the message begun before (and padding) only
        if first == 0:
            yield block
        else:
            yield ReplayedBlock(block.position + first, block.data[first:], block.end_position)
        yield from it
        return


_warned: set[tuple[str, int]] = set()


def _warn_alone(control_channel: str, recording_id: int, insync: int) -> None:
    """Once per recording and process: a reader of one archive of a replicated sink."""
    if (control_channel, recording_id) in _warned:
        return
    _warned.add((control_channel, recording_id))
    log.warning(
        "archive %s: recording %d is an archive sink's target committed with "
        "minInSyncReplicas=%d; a reader of this one archive reads every batch it holds, which "
        "may not be acknowledged yet (or ever, on an old primary): name every archive of the "
        "sink in `archive` to read only what %d of them hold the same",
        control_channel,
        recording_id,
        insync,
        insync,
    )


# The last message boundary found in each recording (a frame boundary, below which a recording
# changes only if truncated), so that listing an active recording again reads what was recorded
# since: (control channel, recording id) -> (its identity, boundary). The identity (start, stream,
# session, initial term, term length, mtu) tells another recording under the same id (a fresh
# archive's catalog at the same channel) apart; a walk from a cached boundary that does not find a
# message's first fragment (or padding) there (the recording truncated and extended since) starts
# again from the term's start. Bounded: the _BOUNDARIES_MAX most recently used recordings are
# kept (a long-running reader of many recordings grew it without limit); a recording evicted
# (not listed for that long) is walked again from its last term's start, at most one term.
_BOUNDARIES_MAX = 4096
_BOUNDARIES: OrderedDict[tuple[str, int], tuple[object, int]] = OrderedDict()
_BOUNDARIES_LOCK = threading.Lock()


def _walk(
    client: ArchiveClient,
    rec: Recording,
    lo: int,
    end: int,
    boundary: int | None,
    check: bool = False,
) -> int | None:
    """The last message boundary of ``[lo, end)`` (``boundary`` when none); with ``check`` (``lo``
    a boundary found before), -1 when the frame at ``lo`` begins no message."""
    first = check
    for block in client.replay(rec.recording_id, lo, end):
        for at, aligned, _length, flags, ftype in frames(block.data):
            if first:
                first = False
                if ftype != _TYPE_PAD and not flags & _FLAG_BEGIN:
                    return -1
            if ftype == _TYPE_PAD:
                boundary = block.position + at + aligned
                continue
            if flags & _FLAG_BEGIN:
                boundary = block.position + at
            if flags & _FLAG_END:
                boundary = block.position + at + aligned
    return boundary


def message_end(client: ArchiveClient, channel: str, rec: Recording, end: int) -> int:
    """The last message boundary at or below ``end`` (a recorded or stop position, a frame
    boundary): ``end`` itself unless the recording ends inside a fragmented message (a publisher
    in the middle of one, a recording stopped there), then where that message begins; the
    recording's start when no message ends in it yet.

    A message never spans terms, so a term's start is a message boundary: the walk reads the
    frames from the last term start (or the boundary found by the previous call, when it is
    further on) to ``end``: at most one term, usually what was recorded since the last call.
    The recording's own start is not one when it begins inside a message (a late join)."""
    start = rec.start
    if end <= start:
        return end
    key = (channel, rec.recording_id)
    identity = rec.identity
    term_start = max(start, (end - 1) // rec.term_length * rec.term_length)
    from_term: int | None = term_start if term_start > start else None
    with _BOUNDARIES_LOCK:
        known = _BOUNDARIES.get(key)
        if known is not None:
            _BOUNDARIES.move_to_end(key)
    boundary: int | None
    if known is not None and known[0] == identity and term_start <= known[1] <= end:
        boundary = known[1]
        if boundary < end:
            boundary = _walk(client, rec, boundary, end, boundary, check=True)
            if boundary == -1:  # not a boundary any more: the bytes there changed
                boundary = _walk(client, rec, term_start, end, from_term)
    else:
        boundary = _walk(client, rec, term_start, end, from_term)
    found = start if boundary is None else boundary
    with _BOUNDARIES_LOCK:
        _BOUNDARIES[key] = (identity, found)
        _BOUNDARIES.move_to_end(key)
        while len(_BOUNDARIES) > _BOUNDARIES_MAX:
            _BOUNDARIES.popitem(last=False)  # the least recently used
    return found


def replay_bounds(p: ArchiveRange) -> tuple[int, int]:
    """Where the replay of ``p`` starts and ends (a share of a split range starts at the term
    boundary below it and reads up to the whole range's end)."""
    return p.start if p.replay_from is None else p.replay_from, p.end if p.exact else p.limit


def served(replayed: Iterable[ReplayedBlock], p: ArchiveRange) -> Iterator[ReplayBlock]:
    """The blocks a task returns from the replay of ``replay_bounds(p)``: its own messages
    (a share), markers turned into padding (a sink's target), the recording's time."""
    kept = from_message_start(replayed) if p.exact else owned(replayed, p)
    if p.sink_target:
        kept = _without_markers(kept)
    return (ReplayBlock(b.position, b.data, p.timestamp_ns, b.end_position) for b in kept)


def split_range(p: ArchiveRange, shares: int) -> list[RecordingRange]:
    """``p`` cut into ``shares`` proportional shares (at least one 32-byte frame each;
    deterministic). A cut need not be a frame boundary: its task replays from the term boundary
    at or below it (a frame boundary) and keeps the messages that begin in its share."""
    cuts = sorted(
        {(p.start + (p.end - p.start) * i // shares) & -FRAME_ALIGNMENT for i in range(1, shares)}
    )
    bounds = [p.start, *(c for c in cuts if p.start < c < p.end), p.end]
    if len(bounds) == 2:
        return [p]
    return [
        dataclasses.replace(
            p,
            start=a,
            end=b,
            limit=p.end,
            exact=False,
            replay_from=None if a == p.start else max(p.start, a // p.term_length * p.term_length),
        )
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]


@dataclass(frozen=True, slots=True)
class ArchiveSession(ArchiveHooks):
    store: ArchiveStore
    client: ArchiveClient
    alone: bool = False  # the source's only archive (not one of a set of replicas)
    # ends moved back to the last message boundary (:func:`message_end`); a set of replicas
    # does it once, on the end of the set, not on every copy
    bound_messages: bool = True

    def recordings(self, stream_ids: tuple[int, ...]) -> list[Recording]:
        client = self.client
        archive_id = client.archive_id()
        out = []
        for stream_id in stream_ids:
            for d in client.list_recordings_for_uri(self.store.channel, stream_id):
                end = d.stop_position
                if d.is_active:
                    end = client.recording_position(d.recording_id)
                    if end < 0:  # stopped since it was listed
                        end = client.stop_position(d.recording_id)
                if end < 0:
                    continue
                target = is_sink_target(d.original_channel)
                insync = 1
                end_marker = None
                if target and end > d.start_position:
                    # read-committed: up to the last END marker of the sink's appends
                    tail = read_tail(
                        client, d.recording_id, d.start_position, end, d.term_buffer_length
                    )
                    end = tail.committed_end
                    insync = 1 if tail.last is None else tail.last.insync
                    if tail.last is not None and tail.last.kind == END:
                        end_marker = tail.last
                    if self.alone and insync > 1:
                        _warn_alone(self.store.connect.control_channel, d.recording_id, insync)
                alias = _target_alias(d.original_channel) if target else ""
                out.append(
                    Recording(
                        f"{archive_id}/{d.recording_id}",
                        self.store,
                        d.recording_id,
                        d.stream_id,
                        d.session_id,
                        d.initial_term_id,
                        d.term_buffer_length,
                        d.mtu_length,
                        d.start_position,
                        d.start_position,  # an archive purges whole recordings' heads
                        end,
                        d.start_timestamp_ms * 1_000_000,
                        committed_only=target,
                        alias=alias,
                        insync=insync,
                        end_marker=end_marker,
                    )
                )
        if self.bound_messages:
            channel = self.store.connect.control_channel
            out = [
                r
                if r.committed_only
                else dataclasses.replace(r, end=message_end(client, channel, r, r.end))
                for r in out
            ]
        return sorted(out, key=lambda r: r.recording_id)

    def scan(self, rec: Recording, start: int, target: int, budget: Budget) -> tuple[int, int]:
        """Replayed from ``start``; the replay is stopped once the budget is spent."""
        if target <= start:
            return start, 0
        if budget.unlimited:
            return target, -1  # everything: the count is not needed
        max_messages, max_bytes = budget.messages, budget.bytes
        end, messages = start, 0
        replay = self.client.replay(rec.recording_id, start, target)
        blocks: Iterable[ReplayedBlock] = from_message_start(replay)
        if rec.committed_only:
            blocks = _without_markers(blocks)
        try:
            for block in blocks:
                for at, aligned, _length, flags, ftype in frames(block.data):
                    if ftype == _TYPE_PAD or not flags & _FLAG_END:
                        continue
                    boundary = block.position + at + aligned
                    if messages and max_bytes is not None and boundary - start > max_bytes:
                        return end, messages
                    end, messages = boundary, messages + 1
                    if max_messages is not None and messages >= max_messages:
                        return end, messages
            return target, messages
        finally:
            replay.close()  # stops the replay if it is still running

    def scan_ranges(
        self, ranges: list[tuple[Recording, int, int]], budget: Budget
    ) -> list[tuple[int, int]]:
        return scan_each(self, ranges, budget)  # one replay per range: no request for many

    @contextmanager
    def replay(self, rec: Recording, start: int, end: int) -> Iterator[Iterator[ReplayBlock]]:
        replay = self.client.replay(rec.recording_id, start, end)
        try:
            replayed = from_message_start(replay)
            if rec.committed_only:
                replayed = _without_markers(replayed)
            yield (ReplayBlock(b.position, b.data, 0, b.end_position) for b in replayed)
        finally:
            replay.close()


@dataclass(frozen=True, slots=True)
class ArchiveStore(Features):
    """One Aeron Archive, reached through ``connect``; recordings whose channel contains
    ``channel`` ("": all)."""

    connect: ArchiveConnect
    channel: str = ""
    name = "archive"  # no time index, pushdown nor consumers (Features' defaults)

    @contextmanager
    def session(self) -> Iterator[ArchiveSession]:
        with connect(self.connect) as client:
            yield ArchiveSession(self, client, alone=True)

    def partition(self, rec: Recording, start: int, end: int, text: bool) -> ArchiveRange:
        return ArchiveRange.exact_of(self, rec, start, end, text)

    def split(self, part: RecordingRange, shares: int) -> list[RecordingRange]:
        assert isinstance(part, ArchiveRange)
        return split_range(part, shares)

    @contextmanager
    def read(self, part: RecordingRange) -> Iterator[Iterator[ReplayBlock]]:
        assert isinstance(part, ArchiveRange)
        p = part
        with connect(self.connect) as client:
            replayed = client.replay(
                p.recording_id,
                *replay_bounds(p),
                session_id=p.session_id,
                stream_id=p.stream_id,
            )
            try:
                yield served(replayed, p)
            finally:
                replayed.close()

"""A set of Aeron Archive replicas as one :class:`~aeron_spark.connector.stores.LogStore`.

``.option("archive", "aeron:udp?endpoint=a:8010,aeron:udp?endpoint=b:8010,...")`` names
archives that hold copies of the same recordings (Aeron Archive's ``replicate``, with or without
a live merge), in preference order. This store reads them through the archive store
(:mod:`..archive`: the same listing, scans and replays), adding only what replicas need:

* **one partition per recording and its copies.** Copies are matched by what replication keeps
  (:attr:`~aeron_spark.connector.stores.Recording.identity`: stream id, session id, initial term
  id, start position, term length, mtu), never by recording id (each archive draws its own). The
  offset key is that identity, ``"<streamId>/<sessionId>/<initialTermId>/<startPosition>/
  <termLength>/<mtu>"``, so an offset or a checkpoint is valid on every replica. An archive
  sink's target (and its copies, which the sink's ``replicas`` make) is matched without its
  session id, which the archive's catalog replaces with each append's (and a copy's with each
  replication's), and by the sink's alias instead, which replication keeps in the original
  channel: its key is ``"<streamId>/<alias>/<initialTermId>/..."``, the same on every copy and
  after every commit. Its
  ``recording_id`` (and the rows' ``recording_id`` column) is the one of the first archive, in
  preference order, that listed it when the batch was planned.
* **the end is what every reachable copy holds** (the smallest of their ends, as Kafka's high
  watermark is the smallest of the in-sync replicas' ends): ``latestOffset`` never passes what
  an archive a task may read from has recorded, so when the archive that held most dies, the
  others still hold every planned range. An archive that does not answer is left out.
* **a task fails over, exactly.** A task replays its range from the first archive (in
  preference order) that answers and holds the copy up to the range's end; when that archive
  fails mid-replay (gone, stalled for ``timeoutMs``, closed), the task goes on from the next one
  *at the position it had reached* (frame boundaries: the same bytes sit at the same positions
  on every copy), so it returns the same rows, each once. Only when no archive can serve does it
  fail, with :class:`~aeron_spark.connector.errors.ReplicasUnavailableError` naming every
  archive and why.
* **a dead archive costs little** (:mod:`..archive.health`): a connect is refused at once when
  the archive's host says its port is closed, and waits at most ``PROBE_S`` (3 s, at most
  ``timeoutMs``) for one that answers nothing; a replay whose archive sends nothing at all, not
  even heartbeats, for ``SILENCE_S`` (1.5 s) fails over then, not after ``timeoutMs``. One that
  failed is tried last by this process for ``SKIP_S`` (30 s), and the driver's partitions name
  the archives it found failing (``avoid``), so the tasks, in other processes, try them last
  too. A slow archive (answering, heartbeats, no data yet) still gets ``timeoutMs``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aeron_spark.connector.archive_markers import Marker, agreed_end, end_at
from aeron_spark.connector.errors import ConnectorError, ReplicasUnavailableError
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.stores import (
    Budget,
    Features,
    Recording,
    RecordingIdentity,
    RecordingRange,
    scan_each,
)
from aeron_spark.connector.stores.archive import (
    ArchiveRange,
    ArchiveSession,
    ArchiveStore,
    replay_bounds,
    served,
    split_range,
)
from aeron_spark.connector.stores.archive.health import (
    PROBE_S,
    RECHECK_INTERVAL_S,
    RECHECK_S,
    connect,
    count_recheck,
    failed_now,
    is_failed,
    mark_failed,
    mark_ok,
    may_recheck,
)
from aeron_spark.connector.stores.archive.hooks import ArchiveHooks
from aeron_spark.connector.stores.archive.source import distinct_archives, message_end
from aeron_spark.transport.archive.client import ArchiveClient
from aeron_spark.transport.archive.client.client import ReplayedBlock
from aeron_spark.transport.errors import TransportError

log = logging.getLogger("aeron_spark.connector.stores.replicas")

# What makes an archive unable to serve (its own errors, the transport's, the OS's): the next
# replica is tried. Anything else (a bug, a bad option) is raised as it is.
FAILOVER_ERRORS = (TransportError, ConnectorError, OSError, TimeoutError)


def _channel(rec: Recording) -> str:
    """The control channel of the archive a copy was listed on."""
    store = rec.store
    assert isinstance(store, ArchiveStore)
    return store.connect.control_channel


def _order(replicas: tuple[ArchiveStore, ...], avoid: tuple[str, ...] = ()) -> list[ArchiveStore]:
    """Preference order, archives that failed lately (here, or on the driver when it planned:
    ``avoid``) last (still tried when the rest fail)."""
    return sorted(
        replicas,
        key=lambda r: r.connect.control_channel in avoid or is_failed(r.connect.control_channel),
    )


def describe(exc: BaseException) -> str:
    """An archive's failure for an error message: its class, its code, its message (errors of
    the archive client never quote credentials)."""
    code = getattr(exc, "archive_code", None) or getattr(exc, "code", None)
    coded = f" {code.name}" if isinstance(code, enum.Enum) else ""
    return f"{type(exc).__name__}{coded}: {exc}"


def identity_key(identity: RecordingIdentity) -> str:
    """The offset key of a recording and its copies (a sink's target: its alias in place of
    the session id)."""
    i = identity
    return (
        f"{i.stream_id}/{i.alias or i.session_id}/{i.initial_term_id}/{i.start_position}/"
        f"{i.term_length}/{i.mtu}"
    )


def find_copy(
    client: ArchiveClient, store: ArchiveStore, identity: RecordingIdentity
) -> Recording | None:
    """This archive's copy of the recording (the one holding most, if several), or None."""
    copies = [
        r
        # raw ends: whether it holds a range's end is all a caller asks (no boundary walk)
        for r in ArchiveSession(store, client, bound_messages=False).recordings(
            (identity.stream_id,)
        )
        if r.identity == identity
    ]
    return max(copies, key=lambda r: r.end, default=None)


def in_sync_end(copies: list[Recording], active: list[bool], archives: int = 0) -> int:
    """The end of a recording of the set: the smallest end of its in-sync copies, which are the
    copies still recording and the stopped ones holding as much as the longest copy. A stopped
    copy that holds less (a replication that ended early, a primary that died and came back
    after the others went on) can never serve the rest: it does not hold the stream back.

    An archive sink's target whose last commit needed ``k`` archives (its ``minInSyncReplicas``,
    in its markers: :attr:`Recording.insync`) is read no further than ``k`` of the set's
    ``archives`` hold (an archive that did not answer, or holds no copy, counts as holding
    nothing): a batch on the primary alone, between its END and its copies, may never be
    acknowledged (the primary lost, the batch run again in another order on a promoted
    replica), and a reader that read it would read other rows on a retry."""
    longest = max(r.end for r in copies)
    kept = [r.end for r, on in zip(copies, active, strict=True) if on or r.end >= longest]
    end = min(kept)
    k = max(r.insync for r in copies)
    if k > 1 and any(r.committed_only for r in copies):
        held = sorted((r.end for r in copies), reverse=True)
        held += [copies[0].start] * max(0, archives - len(held))
        end = min(end, held[k - 1] if k <= len(held) else copies[0].start)
    return end


def _unconfirmed(recs: list[Recording]) -> bool:
    """Whether a sink's target is listed on fewer archives than its last commit needed
    (:attr:`Recording.insync`): another archive must answer before its last batches are read."""
    return any(r.committed_only for r in recs) and len(recs) < max(r.insync for r in recs)


def unavailable(store: ReplicaStore, what: str, failures: dict[str, str]) -> Exception:
    named = {
        r.connect.control_channel: failures.get(r.connect.control_channel, "not tried")
        for r in store.replicas
    }
    reasons = "; ".join(f"{channel}: {why}" for channel, why in named.items())
    return ReplicasUnavailableError(
        f"no archive of the replica set could {what} ({reasons})", archives=named
    )


@dataclass(frozen=True)
class ReplicaRange(ArchiveRange):
    """An :class:`ArchiveRange` of a recording of the set, found on any archive by its
    ``identity``."""

    identity: RecordingIdentity | None = None
    # archives the driver found failing when it planned: the task tries them last
    avoid: tuple[str, ...] = ()
    # a sink's target: the archives that held the same END at ``anchor`` (the readable end
    # when planned, at or past ``end``), the only ones this range may be read from; (): any
    holders: tuple[str, ...] = ()
    anchor: int = -1


class ReplicaSession(ArchiveHooks):
    """One planning call's sessions with the archives of the set (opened when first needed)."""

    def __init__(self, store: ReplicaStore) -> None:
        self.store = store
        self.failures: dict[str, str] = {}
        self._clients: dict[str, ArchiveClient] = {}

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _fail(self, replica: ArchiveStore, exc: BaseException) -> None:
        channel = replica.connect.control_channel
        self.failures[channel] = describe(exc)
        mark_failed(channel)
        client = self._clients.pop(channel, None)
        if client is not None:
            client.close()
        log.warning("archive %s cannot serve (%s); using the other replicas", channel, exc)

    def _client(self, replica: ArchiveStore, probe_s: float = PROBE_S) -> ArchiveClient | None:
        channel = replica.connect.control_channel
        client = self._clients.get(channel)
        if client is None:
            if channel in self.failures:
                return None
            try:
                client = self._clients[channel] = connect(replica.connect, probe_s)
            except FAILOVER_ERRORS as exc:
                self._fail(replica, exc)
                return None
            mark_ok(channel)
        return client

    def _serving(self, skipped_too: bool = True) -> Iterator[tuple[ArchiveStore, ArchiveClient]]:
        """The archives that answer, in preference order; those that failed lately after the
        others, and only when none of the others answered unless ``skipped_too``."""
        fresh = [r for r in self.store.replicas if not is_failed(r.connect.control_channel)]
        stale = [r for r in self.store.replicas if r not in fresh]
        answered = False
        for replica in fresh:
            client = self._client(replica)
            if client is not None:
                answered = True
                yield replica, client
        if answered and not skipped_too:
            return
        for replica in stale:
            client = self._client(replica)
            if client is not None:
                yield replica, client

    def recordings(self, stream_ids: tuple[int, ...]) -> list[Recording]:
        copies: dict[RecordingIdentity, list[Recording]] = {}
        answered = 0
        ids: dict[str, int] = {}
        asked: set[str] = set()

        def list_on(replica: ArchiveStore, client: ArchiveClient) -> None:
            nonlocal answered
            asked.add(replica.connect.control_channel)
            try:
                listed = ArchiveSession(replica, client, bound_messages=False).recordings(
                    stream_ids
                )
            except FAILOVER_ERRORS as exc:
                self._fail(replica, exc)
                return
            if listed:  # keys "<archiveId>/<recordingId>": one archive named twice would hold
                # each copy twice, and a sink's batch on it alone pass for one on two archives
                ids[replica.connect.control_channel] = int(listed[0].key.split("/", 1)[0])
                distinct_archives("archive", ids)
            answered += 1
            for rec in listed:
                copies.setdefault(rec.identity, []).append(rec)

        for replica, client in self._serving(skipped_too=False):
            list_on(replica, client)
        if any(_unconfirmed(recs) for recs in copies.values()):
            # A sink's target on fewer archives than its minInSyncReplicas: the archives skipped
            # since they failed lately are the ones that can confirm it, so they are asked
            # again (a probe of RECHECK_S, enough for a living one to answer; refused at once
            # when its port is closed). The skip orders who serves reads; it does not keep a
            # confirmation from the archive it needs (which, back within seconds, would go
            # unasked for the 30 s of SKIP_S while a reader's timeoutMs runs out).
            for replica in self.store.replicas:
                channel = replica.connect.control_channel
                if channel in asked or channel in self.failures:
                    continue
                if not may_recheck(channel, self.store.recheck_interval_s):
                    continue  # asked lately (an archive really down: not every pass)
                count_recheck()
                again = self._client(replica, RECHECK_S)
                if again is not None:
                    log.info("archive %s, skipped since it failed, answers again", channel)
                    list_on(replica, again)
        if not answered:
            raise unavailable(self.store, "list the recordings", self.failures)
        out = []
        for identity, recs in copies.items():
            end = in_sync_end(recs, self._active(recs), len(self.store.replicas))
            holders: tuple[str, ...] = ()
            held = -1
            if any(r.committed_only for r in recs):
                end, holders = self._agreed(recs, end)
                longest = max(r.end for r in recs)
                held = longest if end < longest else -1
            else:
                end = self._message_end(recs, end)
            # of the first archive (in preference order) holding it
            first = next(r for r in recs if not holders or _channel(r) in holders)
            out.append(
                dataclasses.replace(
                    first,
                    key=identity_key(identity),
                    store=self.store,
                    purged=max(r.purged for r in recs),
                    end=end,
                    end_marker=None,
                    holders=holders,
                    held=held,
                )
            )
        return sorted(out, key=lambda r: (r.timestamp_ns, r.key))

    def _message_end(self, recs: list[Recording], end: int) -> int:
        """The last message boundary at or below ``end`` (:func:`message_end`), read from the
        first copy that holds ``end`` and answers (the same bytes on every copy)."""
        for r in recs:
            channel = _channel(r)
            client = self._clients.get(channel)
            if client is None or r.end < end:
                continue
            try:
                return message_end(client, channel, r, end)
            except FAILOVER_ERRORS as exc:
                assert isinstance(r.store, ArchiveStore)
                self._fail(r.store, exc)
        what = f"read recording {identity_key(recs[0].identity)} up to {end}"
        raise unavailable(self.store, what, self.failures)

    def _agreed(self, recs: list[Recording], end: int) -> tuple[int, tuple[str, ...]]:
        """A sink's target: how far it may be read (``end`` at most) and from which archives:
        the furthest END that as many archives as its commits need (the markers'
        ``minInSyncReplicas``) hold the same, digest included (:func:`agreed_end`). Copies that
        end at one END agree without a read; a copy that goes further is read there (one term)."""
        need = max(r.insync for r in recs)

        def marker_at(i: int, position: int) -> Marker | None:
            r = recs[i]
            client = self._clients.get(_channel(r))
            if client is None:
                return None
            try:
                return end_at(client, r.recording_id, r.start, r.end, r.term_length, position)
            except FAILOVER_ERRORS as exc:
                log.warning(
                    "archive %s: cannot read recording %d at %d (%s); not counted as holding it",
                    _channel(r),
                    r.recording_id,
                    position,
                    exc,
                )
                return None

        copies = [(r.end, r.end_marker) for r in recs]
        position, held = agreed_end(copies, recs[0].start, need, marker_at, below=end)
        if position < end:
            log.warning(
                "recording %s: read up to %d, not %d: fewer than %d archives hold the same "
                "batch there (%s)",
                identity_key(recs[0].identity),
                position,
                end,
                need,
                ", ".join(f"{_channel(r)} up to {r.end}" for r in recs),
            )
        return position, tuple(_channel(recs[i]) for i in held)

    def _active(self, recs: list[Recording]) -> list[bool]:
        """Whether each copy is still recording (it may grow) or stopped."""
        out = []
        for rec in recs:
            replica = rec.store
            assert isinstance(replica, ArchiveStore)
            client = self._clients.get(replica.connect.control_channel)
            try:
                out.append(client is not None and client.recording_position(rec.recording_id) >= 0)
            except FAILOVER_ERRORS:
                out.append(False)
        return out

    def scan(self, rec: Recording, start: int, target: int, budget: Budget) -> tuple[int, int]:
        if target <= start:
            return start, 0
        if budget.unlimited:
            return target, -1  # as the archive store: nothing read, nothing counted
        for replica, client in self._serving():
            if rec.holders and replica.connect.control_channel not in rec.holders:
                continue  # it holds other bytes (a batch never acknowledged), or cannot tell
            try:
                copy = find_copy(client, replica, rec.identity)
                if copy is None or copy.end < target:
                    held = "no copy" if copy is None else f"a copy up to {copy.end}"
                    self.failures[replica.connect.control_channel] = f"holds {held}"
                    continue
                return ArchiveSession(replica, client).scan(copy, start, target, budget)
            except FAILOVER_ERRORS as exc:
                self._fail(replica, exc)
        raise unavailable(
            self.store, f"scan recording {rec.key} in [{start}, {target})", self.failures
        )

    def scan_ranges(
        self, ranges: list[tuple[Recording, int, int]], budget: Budget
    ) -> list[tuple[int, int]]:
        return scan_each(self, ranges, budget)  # one scan per range, each on a replica

    @contextmanager
    def replay(self, rec: Recording, start: int, end: int) -> Iterator[Iterator[ReplayBlock]]:
        with self.store.read(self.store.partition(rec, start, end, False)) as blocks:
            yield blocks


@dataclass(frozen=True, slots=True)
class ReplicaStore(Features):
    """Archives holding copies of the same recordings, in preference order (see the module
    docstring); no time index, pushdown nor consumers, as one archive."""

    replicas: tuple[ArchiveStore, ...]
    # recheckIntervalMs: a marked archive asked again at most this often (health.may_recheck)
    recheck_interval_s: float = RECHECK_INTERVAL_S
    name = "archive replicas"

    @property
    def control_channels(self) -> list[str]:
        return [r.connect.control_channel for r in self.replicas]

    @contextmanager
    def session(self) -> Iterator[ReplicaSession]:
        session = ReplicaSession(self)
        try:
            yield session
        finally:
            session.close()

    def partition(self, rec: Recording, start: int, end: int, text: bool) -> ReplicaRange:
        return ReplicaRange.exact_of(
            self,
            rec,
            start,
            end,
            text,
            identity=rec.identity,
            avoid=failed_now(self.control_channels),
            holders=rec.holders,
            anchor=rec.end,
        )

    def split(self, part: RecordingRange, shares: int) -> list[RecordingRange]:
        assert isinstance(part, ReplicaRange)
        return split_range(part, shares)  # each share keeps the identity

    @contextmanager
    def read(self, part: RecordingRange) -> Iterator[Iterator[ReplayBlock]]:
        assert isinstance(part, ReplicaRange)
        replayed = self._replayed(part)
        try:
            yield served(replayed, part)
        finally:
            replayed.close()

    def _replayed(self, p: ReplicaRange) -> Generator[ReplayedBlock, None, None]:
        """The frames of ``replay_bounds(p)`` from the first archive that serves them; on a
        failure, the rest from the next one, from the position reached."""
        assert p.identity is not None
        position, end = replay_bounds(p)
        failures: dict[str, str] = {}
        for replica in _order(self.replicas, p.avoid):
            channel = replica.connect.control_channel
            if p.holders and channel not in p.holders:
                failures[channel] = f"does not hold the batch ending at {p.anchor} the same"
                continue
            try:
                with connect(replica.connect) as client:
                    mark_ok(channel)
                    copy = find_copy(client, replica, p.identity)
                    if copy is None or copy.end < end:
                        held = "no copy" if copy is None else f"a copy up to {copy.end}"
                        failures[channel] = f"holds {held}, the range ends at {end}"
                        continue
                    replay = client.replay(
                        copy.recording_id,
                        position,
                        end,
                        session_id=p.session_id,
                        stream_id=p.stream_id,
                    )
                    try:
                        for block in replay:
                            yield block
                            position = block.end_position
                    finally:
                        replay.close()
                    return
            except FAILOVER_ERRORS as exc:
                failures[channel] = describe(exc)
                mark_failed(channel)
                log.warning(
                    "archive %s failed at position %d of recording %s (%s); going on from the "
                    "next replica",
                    channel,
                    position,
                    p.key,
                    exc,
                )
        raise unavailable(self, f"replay recording {p.key} from {position} to {end}", failures)

"""Replicas of an archive sink's target recording: ``replicas`` and ``minInSyncReplicas``.

``.option("replicas", "aeron:udp?endpoint=b:8010,aeron:udp?endpoint=c:8010")`` names archives
that keep copies of the sink's target recording, made by Aeron Archive's own replication
(``replicate``: each replica connects to the primary as a client and copies the recording), not
by a protocol of ours. ``minInSyncReplicas`` is Kafka's: how many archives, the primary
included, must hold a batch before its commit completes (1, the default: the primary alone,
today's behaviour; the replicas are then brought up to date best effort).

**A catch-up after each commit, not a live merge.** A live merge (``liveDestination``) needs the
source recorded from a multi-destination (``control-mode=dynamic``) publication that stays open,
so that a replica can join the live stream once its replay has caught up. The sink's target is
not such a stream: each commit extends the stopped target with a publication of its own (the
term geometry continued from the stop position), writes BEGIN, the rows and END, and stops the
recording again; between commits nothing is live. A merge would therefore last one append,
and each append would first have to wait for every replica to find the new publication, catch
up and join before the END could count as replicated; while a replica that cannot join stalls
the merge, not the append, so a merge would still need the end check below. Instead, once the
primary's target is stopped at the batch's END (position ``end``), every replica is asked, in
parallel, to replicate the stopped target into its copy (``dstRecordingId``: the copy is
extended from its stop position with exactly the new bytes; ``stopPosition`` = ``end``). A
stopped source is what replication handles best: it ends by itself (STOP, REPLICATE_END) with the
copy stopped at ``end``, which is checked, byte positions being the same on every copy. The
cost is one replay per replica per commit (the batch's bytes once more over the network), paid
after the append, not during it (``benchmarks/failover.py`` measures rows/s with 1, 2 and 3).

A replica's copy is found by what replication keeps of the primary's descriptor (stream id,
initial term id, start position, term length, mtu and the original channel, which carries the
sink's alias), not by its recording id, which each archive draws for itself, nor by its session
id, which the archive's catalog replaces with each extending image's. A copy whose end is
neither where the primary ended before this commit nor where it ends now (a replica down during
a commit, a replication cut off, a batch undone below) is repaired first: cut back to its last
END marker that the primary holds at the same position, else purged and copied afresh.

The commit (:class:`~aeron_spark.connector.stores.archive.sink.ArchiveCommitter`) asks before it
appends whether ``minInSyncReplicas - 1`` replicas answer at all (else NOT_ENOUGH_REPLICAS with
nothing written, as Kafka refuses a produce when the in-sync set is too small); after the append,
if fewer copies than that reached the END, it cuts the batch off the primary (and the copies
that got it) and fails with NOT_ENOUGH_REPLICAS: nothing acknowledged, and a committed-only
reader, which stops at the last END, does not see the batch from then on.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aeron_spark.connector.archive_markers import (
    END,
    Marker,
    agreed_end,
    end_at,
    markers_in,
    newest,
    next_epoch,
    read_tail,
)
from aeron_spark.connector.errors import ConnectorError, ServerUnavailableError
from aeron_spark.connector.options import ArchiveConnect, ArchiveSinkOptions
from aeron_spark.connector.stores.archive import health
from aeron_spark.connector.stores.archive.source import connect, distinct_archives
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import TransportError
from aeron_spark.transport.archive.client import (
    ArchiveClient,
    ArchiveClientError,
    RecordingDescriptor,
    RecordingSignal,
    ReplicationParams,
)

log = logging.getLogger("aeron_spark.connector.archive_sink")

# What a replica may fail with: it then counts as not in sync (its reason in the error).
REPLICA_FAILURES = (ArchiveClientError, ConnectorError, TransportError, OSError)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class ReplicaOutcome:
    """What one replica did in one commit."""

    control_channel: str
    in_sync: bool = False
    recording_id: int = -1  # its copy of the target
    reason: str = ""  # why not in sync
    replicated: bool = False  # a replication ran (False: the copy was in sync already)
    repaired: str = ""  # "truncated" or "purged" when the copy had to be repaired first


def _identity(d: RecordingDescriptor) -> tuple[int | str, ...]:
    """What a copy shares with the target. Not the session id: the archive's catalog takes the
    session id of the image that extends a recording (each append publishes with a new one),
    so the target's changes with every commit while a copy keeps the one it was made with. The
    original channel (with the sink's alias) is kept by replication."""
    return (
        d.stream_id,
        d.initial_term_id,
        d.start_position,
        d.term_buffer_length,
        d.mtu_length,
        d.original_channel,
    )


def find_copy(client: ArchiveClient, target: RecordingDescriptor) -> RecordingDescriptor | None:
    """The archive's copy of ``target`` (another archive's recording), by what replication
    keeps; the newest if there are several."""
    want = _identity(target)
    found = [
        d
        for d in client.list_recordings_for_uri("aeron:", target.stream_id)
        if _identity(d) == want
    ]
    return max(found, key=lambda d: d.recording_id) if found else None


def _stopped(
    client: ArchiveClient, d: RecordingDescriptor, timeout_s: float
) -> RecordingDescriptor:
    """``d`` stopped (a replication of an earlier commit still recording into it: stopped)."""
    if not d.is_active:
        return d
    client.stop_recording_by_identity(d.recording_id)
    deadline = time.monotonic() + timeout_s
    while client.stop_position(d.recording_id) < 0:
        if time.monotonic() > deadline:
            raise ArchiveClientError(f"copy {d.recording_id} did not stop within {timeout_s:g} s")
        time.sleep(0.02)
    again = client.list_recording(d.recording_id)
    assert again is not None
    return again


def _same_end(client: ArchiveClient, copy: RecordingDescriptor, ends: dict[int, Marker]) -> bool:
    """Whether ``copy`` ends with the primary's END marker known for its stop position
    (digest included: the same batch with its rows in another order differs there), read
    as one frame; True when none is known there (nothing to compare)."""
    m = ends.get(copy.stop_position)
    if m is None or m.position < copy.start_position:
        return True
    data = b"".join(b.data for b in client.replay(copy.recording_id, m.position, m.end_position))
    return markers_in(data, m.position) == [m]


class Replicas:
    """Control sessions with the replica archives of one commit (a thread each: a dead
    replica's time-out runs beside the others, not after them)."""

    def __init__(
        self,
        o: ArchiveSinkOptions,
        identity: str,
        clients: list[ArchiveClient | None] | None = None,
        errors: list[str] | None = None,
    ) -> None:
        """``clients`` / ``errors``: sessions (or why none) an election opened already, in
        ``o.replicas`` order (taken over: closed here)."""
        self.o = o
        self.identity = identity
        self.connects: tuple[ArchiveConnect, ...] = o.replicas
        self.clients: list[ArchiveClient | None] = clients or [None] * len(o.replicas)
        self.errors: list[str] = errors or [""] * len(o.replicas)
        self.stopped_replications = 0  # replications given up on and stopped (_give_up)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, len(o.replicas)), thread_name_prefix="archive-replica"
        )

    @property
    def required(self) -> int:
        """Replicas that must hold a batch besides the primary."""
        return self.o.min_insync_replicas - 1

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for i, client in enumerate(self.clients):
            if client is not None:
                try:
                    client.close()
                except REPLICA_FAILURES:
                    pass
                self.clients[i] = None
        self._pool.shutdown(wait=True)

    def connect(self) -> int:
        """Connect to every replica at once (not those an election tried); how many answered."""
        futures = {
            i: self._pool.submit(health.connect, c)
            for i, c in enumerate(self.connects)
            if self.clients[i] is None and not self.errors[i]
        }
        for i, future in futures.items():
            try:
                self.clients[i] = future.result()
                self.errors[i] = ""
                health.mark_ok(self.connects[i].control_channel)
            except REPLICA_FAILURES as exc:
                self.errors[i] = f"unreachable ({describe(exc)})"
                health.mark_failed(self.connects[i].control_channel)
                log.warning(
                    "archive sink %s: replica %s: %s",
                    self.identity,
                    self.connects[i].control_channel,
                    self.errors[i],
                )
        return sum(c is not None for c in self.clients)

    def unreachable(self) -> dict[str, str]:
        return {
            c.control_channel: self.errors[i]
            for i, c in enumerate(self.connects)
            if self.clients[i] is None
        }

    # ---------------------------------------------------------- bringing copies up to date

    def sync(
        self,
        target: RecordingDescriptor,
        base: int,
        end: int,
        ends: dict[int, Marker] | None = None,
    ) -> list[ReplicaOutcome]:
        """Every reachable replica's copy of the stopped ``target`` brought to ``end`` (``base``:
        where the primary ended before this commit, -1 for a new target), in parallel.
        ``ends``: the primary's END markers known, by their end position (a copy that ends at
        one of them must hold the same marker there)."""
        futures = {
            i: self._pool.submit(self._sync_one, i, target, base, end, ends or {})
            for i, client in enumerate(self.clients)
            if client is not None
        }
        out = []
        for i, c in enumerate(self.connects):
            if i not in futures:
                out.append(ReplicaOutcome(c.control_channel, reason=self.errors[i]))
                continue
            try:
                out.append(futures[i].result())
            except REPLICA_FAILURES as exc:
                out.append(ReplicaOutcome(c.control_channel, reason=describe(exc)))
            if not out[-1].in_sync:
                log.warning(
                    "archive sink %s: replica %s not in sync at %d: %s",
                    self.identity,
                    c.control_channel,
                    end,
                    out[-1].reason,
                )
        return out

    def _sync_one(
        self,
        i: int,
        target: RecordingDescriptor,
        base: int,
        end: int,
        ends: dict[int, Marker],
    ) -> ReplicaOutcome:
        client = self.clients[i]
        assert client is not None
        timeout = self.o.sink.settings.timeout_s
        outcome = ReplicaOutcome(self.connects[i].control_channel)
        copy = find_copy(client, target)
        if copy is not None:
            copy = _stopped(client, copy, timeout)
            if copy.stop_position not in (base, end) or not _same_end(client, copy, ends):
                copy, outcome.repaired = self._repair(client, copy, target, end)
        if copy is not None and copy.stop_position == end:
            outcome.in_sync, outcome.recording_id = True, copy.recording_id
            return outcome
        params = ReplicationParams(
            stop_position=end,
            dst_recording_id=-1 if copy is None else copy.recording_id,
            credentials=self.o.connect.credentials,
        )
        replication = client.replicate(
            target.recording_id,
            self.o.connect.control_channel,
            self.o.connect.control_stream_id,
            params,
        )
        outcome.replicated = True
        try:
            status = client.wait_for_replication(replication, RecordingSignal.STOP)
            client.wait_for_replication(replication, RecordingSignal.REPLICATE_END)
        except REPLICA_FAILURES:
            self._give_up(client, i, replication)
            raise
        outcome.recording_id = status.recording_id
        stop = client.stop_position(status.recording_id)
        if stop != end:
            outcome.reason = f"its copy {status.recording_id} stopped at {stop}, not {end}"
            return outcome
        outcome.in_sync = True
        return outcome

    def _give_up(self, client: ArchiveClient, i: int, replication: int) -> None:
        """Stop a replication the commit no longer waits for. Left running, it would go on
        copying after the commit failed: a replica cut off from the primary that can reach it
        again within the archive's own time-outs (a partition healing) would copy a batch that
        was never acknowledged, which the primary could not cut off (unreachable itself, or
        replaying it to that replica). Best effort: a replica the driver cannot reach either is
        repaired by the next commit (a copy longer than the primary's END is cut back)."""
        try:
            stopped = client.try_stop_replication(replication)
        except REPLICA_FAILURES as exc:
            log.warning(
                "archive sink %s: replica %s: replication %d not stopped: %s",
                self.identity,
                self.connects[i].control_channel,
                replication,
                describe(exc),
            )
            return
        with self._lock:
            self.stopped_replications += stopped
        log.warning(
            "archive sink %s: replica %s: replication %d %s",
            self.identity,
            self.connects[i].control_channel,
            replication,
            "stopped (given up on)" if stopped else "was over already",
        )

    def _repair(
        self,
        client: ArchiveClient,
        copy: RecordingDescriptor,
        target: RecordingDescriptor,
        end: int,
    ) -> tuple[RecordingDescriptor | None, str]:
        """``copy`` cut back to its last END marker that the primary holds at the same
        position (so that the copy is a prefix of the primary: :meth:`_common_end`), else
        purged (None)."""
        term = copy.term_buffer_length
        with connect(self.o.connect) as primary:
            for _ in range(4):  # torn tails: each round cuts one off
                tail = read_tail(
                    client, copy.recording_id, copy.start_position, copy.stop_position, term
                )
                if tail.last is None:
                    break
                cut = tail.committed_end
                if tail.last.kind == END:
                    common = self._common_end(client, copy, primary, target, end, tail.last)
                    if common is None:
                        break
                    if common < copy.stop_position:
                        client.truncate_recording(copy.recording_id, common)
                    again = client.list_recording(copy.recording_id)
                    assert again is not None
                    log.warning(
                        "archive sink %s: replica copy %d cut back to %d (the primary's END there)",
                        self.identity,
                        copy.recording_id,
                        common,
                    )
                    return again, "truncated"
                client.truncate_recording(copy.recording_id, cut)  # torn: to its BEGIN
                again = client.list_recording(copy.recording_id)
                assert again is not None
                copy = again
        log.warning(
            "archive sink %s: replica copy %d holds what the primary does not; purged",
            self.identity,
            copy.recording_id,
        )
        client.purge_recording(copy.recording_id)
        return None, "purged"

    WALK = 8  # ENDs of a copy tried from its last one down, before it is purged instead

    def _common_end(
        self,
        client: ArchiveClient,
        copy: RecordingDescriptor,
        primary: ArchiveClient,
        target: RecordingDescriptor,
        end: int,
        last: Marker,
    ) -> int | None:
        """Where the copy's history and the primary's part (Kafka's truncation to the end of
        the last common epoch): the end of the copy's last END that the primary holds the same
        at the same position (epoch and digest included), walking down the copy's ENDs from
        ``last`` (each batch begins where the END before it ends; :attr:`WALK` of them at
        most); None when none is found (the copy is purged)."""
        term = copy.term_buffer_length
        m: Marker | None = last
        for _ in range(self.WALK):
            if m is None:
                return None
            at = m.end_position
            if at <= end:
                mine = end_at(primary, target.recording_id, target.start_position, end, term, at)
                if mine == m:
                    return at
            below = m.begin_position  # past the primary's end, or another batch: the one before
            m = end_at(client, copy.recording_id, copy.start_position, below, term, below)
        return None

    def undo(self, outcomes: list[ReplicaOutcome], begin: int) -> None:
        """Cut the copies that got an undone batch back to ``begin`` (best effort: a copy left
        longer is repaired by the next commit)."""
        by_channel = {c.control_channel: i for i, c in enumerate(self.connects)}
        for o in outcomes:
            client = self.clients[by_channel[o.control_channel]]
            if client is None or o.recording_id < 0:
                continue
            try:
                stop = client.stop_position(o.recording_id)
                if stop > begin:
                    client.truncate_recording(o.recording_id, begin)
            except REPLICA_FAILURES as exc:
                log.warning(
                    "archive sink %s: replica %s: copy %d not cut back to %d: %s",
                    self.identity,
                    o.control_channel,
                    o.recording_id,
                    begin,
                    describe(exc),
                )


# ------------------------------------------------------------------ promotion


@dataclass
class Election:
    """Which archive a commit appends to: the reachable one holding the furthest committed END
    of the sink (ties: the configured order, ``archive`` first), with every session opened."""

    chosen: int  # 0: ``archive``, k: the k-th replica
    clients: list[ArchiveClient | None]  # (archive, *replicas); None: unreachable
    errors: list[str]
    ends: list[int]  # committed end of the sink's recording on each (-1: none, or unreachable)
    epoch: int = 0  # the epoch the commit writes under (:func:`next_epoch`)
    owner: int = 0  # the chosen archive's id (in the markers it writes)
    opens_epoch: bool = False  # the epoch is new: opened on minInSyncReplicas archives first


def sink_recording(client: ArchiveClient, alias: str, stream_id: int) -> RecordingDescriptor | None:
    """The sink's target on this archive, or its copy of it: the newest recording of the stream
    whose original channel carries the sink's alias (replication keeps the original channel)."""
    found = [
        d
        for d in client.list_recordings_for_uri(f"alias={alias}", stream_id)
        if f"alias={alias}" in d.original_channel
    ]
    return max(found, key=lambda d: d.recording_id) if found else None


@dataclass(frozen=True, slots=True)
class _Held:
    """What an archive holds of the sink's recording: its committed end and the END there."""

    d: RecordingDescriptor | None
    end: int  # -1: no recording
    last: Marker | None  # the END marker ending at ``end`` (None: none, or a torn tail)


def _committed_end(client: ArchiveClient, alias: str, stream_id: int) -> _Held:
    d = sink_recording(client, alias, stream_id)
    if d is None:
        return _Held(None, -1, None)
    end = d.stop_position if d.stop_position >= 0 else client.recording_position(d.recording_id)
    if end < 0:
        end = client.stop_position(d.recording_id)
    term = d.term_buffer_length
    tail = read_tail(client, d.recording_id, d.start_position, end, term)
    last = tail.last if tail.last is not None and tail.last.kind == END else None
    if tail.torn:  # the END its committed end is (its epoch: what the election compares)
        at = tail.committed_end
        last = end_at(client, d.recording_id, d.start_position, at, term, at)
    return _Held(d, tail.committed_end, last)


def _not_electable(
    archives: tuple[ArchiveConnect, ...], out: list[int], why: str, *args: object
) -> None:
    """Warn that the reachable archives ``out`` (if any) are left out of the election;
    ``why`` (%-style, with ``args``) says what they lack."""
    if out:
        log.warning(
            "archive sink: %s " + why + ": not electable",
            [archives[i].control_channel for i in out],
            *args,
        )


def _electable(
    archives: tuple[ArchiveConnect, ...],
    clients: list[ArchiveClient | None],
    held: list[_Held],
) -> list[int]:
    """The reachable archives that hold the last batch acknowledged as far as they can tell:
    those holding the furthest END that as many of them as its commit needed (the markers'
    ``minInSyncReplicas``) hold the same, digest included (:func:`agreed_end`). An old primary
    back with a batch never acknowledged, where the promoted replica and its copy hold the batch
    run again (same size: same END position), holds another END there and is not electable:
    electing it (it comes first in the configured order) would cut the acknowledged batch off
    the others. When no END is held by that many, every reachable archive is."""
    reachable = [i for i, c in enumerate(clients) if c is not None and held[i].d is not None]
    top = [reachable[j] for j in newest([(held[i].end, held[i].last) for i in reachable])]
    if top:  # markers with epochs: the newest history (highest epoch, then furthest end)
        _not_electable(
            archives,
            [i for i in reachable if i not in top],
            "hold an older epoch or less than %s (epoch %d, end %d)",
            [archives[i].control_channel for i in top],
            held[top[0]].last.epoch,  # type: ignore[union-attr]  # newest: top has an epoch
            held[top[0]].end,
        )
        return top
    if len(reachable) < 2:
        return [i for i, c in enumerate(clients) if c is not None]
    lasts = [m for m in (held[i].last for i in reachable) if m is not None]
    need = max((m.insync for m in lasts), default=1)
    start = min(held[i].d.start_position for i in reachable)  # type: ignore[union-attr]

    def marker_at(j: int, position: int) -> Marker | None:
        i = reachable[j]
        d, client = held[i].d, clients[i]
        assert d is not None and client is not None
        try:
            end = held[i].end
            term = d.term_buffer_length
            return end_at(client, d.recording_id, d.start_position, end, term, position)
        except REPLICA_FAILURES as exc:
            log.warning(
                "archive sink: %s: cannot read its END at %d (%s)",
                archives[i].control_channel,
                position,
                exc,
            )
            return None

    copies = [(held[i].end, held[i].last) for i in reachable]
    position, agreeing = agreed_end(copies, start, need, marker_at)
    if position == start:
        return [i for i, c in enumerate(clients) if c is not None]
    chosen = [reachable[j] for j in agreeing]
    _not_electable(
        archives,
        [i for i in reachable if i not in chosen],
        "do not hold the END at %d that %s hold (minInSyncReplicas=%d)",
        position,
        [archives[i].control_channel for i in chosen],
        need,
    )
    return chosen + [i for i, c in enumerate(clients) if c is not None and held[i].d is None]


def elect(o: ArchiveSinkOptions, alias: str) -> Election:
    """Connect to ``archive`` and every replica at once and pick the commit's primary.

    The Spark driver is the only writer of a sinkId, so the archive holding the furthest
    committed END holds every acknowledged batch (``minInSyncReplicas`` >= 2: each is on at
    least two archives, so on a reachable one unless that many are gone): appending there and
    bringing the others to it (cutting back what they hold beyond their last common END) loses
    nothing acknowledged. ``archive`` itself stays the primary while it is reachable and not
    behind; an old primary that comes back behind a promoted replica becomes its replica.

    With epochs in the markers the archive whose last END has the highest epoch, then the
    furthest end, is chosen (:func:`~aeron_spark.connector.archive_markers.newest`), and the
    election says under which epoch the commit writes and whether it opens it first
    (:func:`~aeron_spark.connector.archive_markers.next_epoch`)."""
    archives = (o.connect, *o.replicas)
    clients: list[ArchiveClient | None] = [None] * len(archives)
    errors = [""] * len(archives)
    ends = [-1] * len(archives)
    stream_id = o.sink.stream_id

    def probe(c: ArchiveConnect) -> tuple[ArchiveClient, _Held, int]:
        # an archive that answers nothing costs PROBE_S at most; one that failed lately in this
        # process (the driver: an earlier commit) RECHECK_S, enough for a living one to answer
        failed = health.is_failed(c.control_channel)
        if failed:
            health.count_recheck()
        client = health.connect(c, health.RECHECK_S if failed else health.PROBE_S)
        try:
            return client, _committed_end(client, alias, stream_id), client.archive_id()
        except BaseException:
            client.close()
            raise

    held = [_Held(None, -1, None)] * len(archives)
    ids: dict[str, int] = {}  # each reachable archive's id: one archive named twice is refused
    with ThreadPoolExecutor(len(archives), thread_name_prefix="archive-elect") as pool:
        futures = [pool.submit(probe, c) for c in archives]
        for i, future in enumerate(futures):
            try:
                clients[i], held[i], ids[archives[i].control_channel] = future.result()
                ends[i] = held[i].end
                health.mark_ok(archives[i].control_channel)
            except REPLICA_FAILURES as exc:
                errors[i] = f"unreachable ({describe(exc)})"
                health.mark_failed(archives[i].control_channel)
    try:
        distinct_archives("replicas", ids)
    except ConfigurationError:
        for c in clients:
            if c is not None:
                c.close()
        raise
    reachable = [i for i, c in enumerate(clients) if c is not None]
    if not reachable:
        raise ServerUnavailableError(
            "archive sink: no archive of the sink answers: "
            + "; ".join(f"{a.control_channel}: {e}" for a, e in zip(archives, errors, strict=True))
        )
    chosen = max(_electable(archives, clients, held), key=lambda i: (ends[i], -i))
    owner = ids[archives[chosen].control_channel]
    epoch, opens = next_epoch([(h.end, h.last) for h in held], chosen, owner)
    if chosen != 0:
        log.warning(
            "archive sink %s: promoting %s (committed end %d; %s: %s)",
            alias,
            archives[chosen].control_channel,
            ends[chosen],
            o.connect.control_channel,
            errors[0] or f"behind, at {ends[0]}",
        )
    if opens:
        log.info(
            "archive sink %s: %s opens epoch %d", alias, archives[chosen].control_channel, epoch
        )
    return Election(chosen, clients, errors, ends, epoch, owner, opens)


__all__ = [
    "REPLICA_FAILURES",
    "Election",
    "ReplicaOutcome",
    "Replicas",
    "describe",
    "elect",
    "find_copy",
    "sink_recording",
]

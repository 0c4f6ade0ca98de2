"""The log-store contract the ``aeron`` source and sink are written over, once.

The source (:mod:`aeron_spark.connector.source`) knows offsets, start and ending positions,
``failOnDataLoss``, read limits, ``minPartitions``, AvailableNow, ``reportLatestOffset`` and
committed-only reads; the sink (:mod:`aeron_spark.connector.sink`) knows Spark's writers and
commit identities. What they need of the place the messages live is this small interface, and
the stream server (:mod:`.server`) and an Aeron Archive (:mod:`.archive`) are its two
implementations, a package each.

Reading (:class:`LogStore`, one per server or archive the source reads from):

* :meth:`StoreSession.recordings`: the recordings of some streams, each a :class:`Recording`
  under its offset key, with its start, first readable (``purged``) and end position (the
  recorded position of an active recording, the stop position of a stopped one; for a
  recording a sink appends to with markers, the end of its last committed batch: readers see
  committed data only);
* :meth:`StoreSession.scan`: the furthest message boundary of a range within a message/byte
  budget (how micro-batches and ``minMessagesPerTrigger`` are measured);
  :meth:`StoreSession.scan_ranges` the same for many ranges of one store within one shared
  budget (the stream server answers it in one request; :func:`scan_each` is one ``scan`` per
  range, for a store without such a request);
* :meth:`LogStore.split`: a range cut into shares whose rows are the range's, each message in
  exactly one share (``minPartitions``);
* :meth:`LogStore.read`: bounded replay blocks of one :class:`RecordingRange` on an executor,
  the same bytes every time (a retried task returns the same rows); :meth:`LogStore.read_many`
  the same for the ranges of a packed input partition (one request to a stream server);
* optional hooks: :meth:`StoreSession.position_at` (a time index: ``startingTimestamp``),
  :meth:`StoreSession.narrow` (filter pushdown, :mod:`..pushdown`), and
  :meth:`StoreSession.commit_consumer` (retention that keeps what a query has not read).
  A store without them declares it (``time_index``, ``pushdown``, ``consumers``) and
  :mod:`..options` refuses the options that need them at ``load()``.

Writing (:class:`SinkStore`): ``stage`` a task's rows (an executor), ``commit`` a batch's staged
parts once per (identity, batch id) and ``abort`` them (the driver).

Replicas. A recording is identified by what Aeron keeps the same on every copy of it:
:attr:`Recording.identity` (stream id, session id, initial term id, start position, term length,
mtu), not by its recording id, which each archive draws for itself. Positions are the same on
every replica, so an offset or a :class:`RecordingRange` is valid on any of them. A store that is
a *set of replicas* (several archives following one primary) is therefore a third
implementation of this same interface (:mod:`.replicas`, over :mod:`.archive`), not a copy of
the source: its ``recordings`` lists one :class:`Recording` per identity (keyed by it), ending
where every reachable in-sync copy has recorded, its ``read`` replays the exact range
``[start, end)`` of that identity from one replica and, when that replica fails, goes on with the
same range on the next from the position reached (the rows cannot differ: same bytes at the same
positions), and its sink
side acknowledges a commit once enough replicas hold the batch's END marker. Nothing here
assumes one process per store: a partition carries its store, which holds only what a task needs
to reach it (small, frozen, picklable).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from pyspark.sql.datasource import InputPartition, WriterCommitMessage

from aeron_spark.connector.session.budget import share_budget
from aeron_spark.connector.session.replay import ReplayBlock

if TYPE_CHECKING:
    import pyarrow as pa

    from aeron_spark.connector.archive_markers import Marker
    from aeron_spark.connector.formats_records import Decoding
    from aeron_spark.connector.formats_sbe import SbeRead
    from aeron_spark.connector.pushdown import Pushed


@dataclass(frozen=True, slots=True)
class RecordingIdentity:
    """What every copy (replica) of a recording has in common (Aeron's replication keeps it)."""

    stream_id: int
    session_id: int
    initial_term_id: int
    start_position: int
    term_length: int
    mtu: int
    # an archive sink's target: the sink's alias, in place of the session id (each append
    # extends the target with a new session id, which the archive's catalog keeps: 0 here)
    alias: str = ""


@dataclass(frozen=True, slots=True)
class Recording:
    """A recording of a store, under the source's offset key for it.

    ``start`` is its first position, ``purged`` the first one still readable (``>= start``),
    ``end`` the end of what may be read now (see the module docstring)."""

    key: str
    store: LogStore
    recording_id: int
    stream_id: int
    session_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    start: int
    purged: int
    end: int
    timestamp_ns: int = 0  # its start time
    committed_only: bool = False  # a sink's target: markers are not rows, reads stop at END
    alias: str = ""  # a sink's target: the alias of its channel (the sink's name)
    insync: int = 1  # a sink's target: archives its last commit needed (its minInSyncReplicas)
    # a sink's target: the END marker ending at ``end`` (None: not read, or a torn tail)
    end_marker: Marker | None = None
    # a recording of a set of archives: the control channels of the archives whose copies hold
    # ``end`` the same (a sink's target: the same END marker there, digest included), the only
    # ones a read of it may use; (): any
    holders: tuple[str, ...] = ()
    # a recording of a set of archives whose ``end`` is held back below what a copy holds
    # (fewer archives than its ``minInSyncReplicas`` confirm an END further on): the furthest
    # a copy holds, so an offset past ``end`` but within it is not taken for a truncation;
    # -1: not held back
    held: int = -1

    @property
    def identity(self) -> RecordingIdentity:
        return RecordingIdentity(
            self.stream_id,
            0 if self.alias else self.session_id,
            self.initial_term_id,
            self.start,
            self.term_length,
            self.mtu,
            self.alias,
        )


@dataclass(frozen=True)
class RecordingRange(InputPartition):
    """One task's work: the messages of one recording in ``[start, end)``, and how to decode
    them. ``store`` reads it (:meth:`LogStore.read`); a store may subclass this to carry how
    it replays a share of a split range."""

    store: LogStore
    key: str
    recording_id: int
    start: int
    end: int
    initial_term_id: int
    term_length: int
    text: bool
    arrow_schema: bytes | None = None  # format=arrow: the serialized Arrow schema of the rows
    decoding: Decoding | None = None  # json, msgpack; text read past bad records
    sbe: SbeRead | None = None  # format=sbe

    @classmethod
    def of(
        cls, store: LogStore, rec: Recording, start: int, end: int, text: bool, **more: Any
    ) -> Any:
        """A range of ``rec`` (``more``: the fields a store's subclass adds)."""
        return cls(
            store,
            rec.key,
            rec.recording_id,
            start,
            end,
            rec.initial_term_id,
            rec.term_length,
            text,
            **more,
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """How much a scan may take: messages and recorded bytes (None: no bound)."""

    messages: int | None = None
    bytes: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.messages is None and self.bytes is None


class StoreSession(Protocol):
    """A session with one store, held while the driver plans (one per store and call)."""

    def recordings(self, stream_ids: tuple[int, ...]) -> list[Recording]: ...

    def scan(self, rec: Recording, start: int, target: int, budget: Budget) -> tuple[int, int]:
        """``(end, messages)``: the furthest message boundary in ``(start, target]`` within the
        budget (at least one message when there is one). ``messages`` is -1 when the budget is
        unlimited and the store did not count (then ``end`` is ``target``)."""
        ...

    def scan_ranges(
        self, ranges: list[tuple[Recording, int, int]], budget: Budget
    ) -> list[tuple[int, int]]:
        """``(end, messages)`` per ``(rec, start, target)`` of ``ranges``, within one budget
        shared as :func:`~aeron_spark.connector.session.budget.share_budget` shares it (as
        :func:`scan_each` would find them; messages -1: not counted)."""
        ...

    def replay(
        self, rec: Recording, start: int, end: int
    ) -> AbstractContextManager[Iterator[ReplayBlock]]:
        """Blocks of whole messages covering ``[start, end)`` (message boundaries)."""
        ...

    def position_at(self, rec: Recording, timestamp_ns: int) -> int: ...

    def message_ends(self, recs: list[Recording]) -> dict[str, int] | None:
        """The last message boundary at or below each recording's end, by key, from the store's
        catalog without reading data (what a micro-batch without a limit needs); None when the
        store cannot answer so (the reader then scans)."""
        ...

    def narrow(self, pushed: Pushed, rec: Recording, start: int, end: int) -> tuple[int, int]: ...

    def commit_consumer(
        self, consumer_id: str, stream_ids: tuple[int, ...], positions: dict[str, int]
    ) -> None: ...


class Features:
    """What a store can do besides the contract (a store class inherits this and turns on its
    own): ``time_index``: ``position_at``; ``pushdown``: ``narrow``; ``consumers``:
    ``commit_consumer``."""

    __slots__ = ()
    time_index = False
    pushdown = False
    consumers = False

    def read_many(
        self, parts: Sequence[RecordingRange]
    ) -> AbstractContextManager[Iterator[Iterator[ReplayBlock]]]:
        return read_each(cast("LogStore", self), parts)


class LogStore(Protocol):
    """A store the source reads: small, frozen and picklable (partitions carry it)."""

    name: str  # in errors: "stream server", "archive"
    time_index: bool  # position_at (startingTimestamp, endingTimestamp, timestamp pushdown)
    pushdown: bool  # narrow (filter pushdown of batch reads)
    consumers: bool  # commit_consumer (consumerId)

    def session(self) -> AbstractContextManager[StoreSession]: ...

    def partition(self, rec: Recording, start: int, end: int, text: bool) -> RecordingRange: ...

    def split(self, part: RecordingRange, shares: int) -> list[RecordingRange]:
        """``part`` cut into about ``shares`` ranges whose messages are ``part``'s, in order."""
        ...

    def read(self, part: RecordingRange) -> AbstractContextManager[Iterator[ReplayBlock]]:
        """The blocks of ``part``'s messages (an executor; its own session)."""
        ...

    def read_many(
        self, parts: Sequence[RecordingRange]
    ) -> AbstractContextManager[Iterator[Iterator[ReplayBlock]]]:
        """The blocks of each of ``parts`` (this store's ranges of one packed input partition):
        one iterator per part, in order, each read before the next is taken, the blocks
        :meth:`read` gives. :class:`Features` reads them one by one (:func:`read_each`); the
        stream server asks for them all in one request."""
        ...


class SinkStore(Protocol):
    """Where a sink's batches go: staged by tasks, committed once per (identity, batch)."""

    name: str

    def stage(
        self, identity: str, batch_id: int, rows: Iterator[pa.RecordBatch]
    ) -> WriterCommitMessage: ...

    def commit(self, identity: str, batch_id: int, messages: list, repeated: str | None) -> None:
        """Append the staged parts ``messages`` name, once per ``(identity, batch_id)``;
        ``repeated``: why a repeated commit may happen (warned about), None: not expected."""
        ...

    def abort(self, identity: str, batch_id: int, messages: list) -> None: ...


def scan_each(
    session: StoreSession, ranges: list[tuple[Recording, int, int]], budget: Budget
) -> list[tuple[int, int]]:
    """:meth:`StoreSession.scan_ranges` as one :meth:`StoreSession.scan` per range."""

    def scan_one(
        i: int, start: int, target: int, messages: int | None, nbytes: int | None
    ) -> tuple[int, int]:
        return session.scan(ranges[i][0], start, target, Budget(messages, nbytes))

    return share_budget([(s, t) for _, s, t in ranges], budget.messages, budget.bytes, scan_one)


@contextmanager
def read_each(
    store: LogStore, parts: Sequence[RecordingRange]
) -> Iterator[Iterator[Iterator[ReplayBlock]]]:
    """:meth:`LogStore.read_many` as one :meth:`LogStore.read` per part, each closed when the
    next is taken."""

    def each() -> Generator[Iterator[ReplayBlock], None, None]:
        for part in parts:
            with store.read(part) as blocks:
                yield blocks

    parts_blocks = each()
    try:
        yield parts_blocks
    finally:
        parts_blocks.close()


def no_hook(store: Any, what: str) -> NotImplementedError:
    """A hook the store declared it lacks (options refuse what needs it before this)."""
    return NotImplementedError(f"the {store.name} store has no {what}")

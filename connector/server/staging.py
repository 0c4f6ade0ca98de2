"""Sink staging and exactly-once commits (issue 7's server side).

Layout under ``<server dir>/sink/``::

    commit.log                                   fsynced commit log (commitlog.py)
    staged/<sink id hex>/<batch id>/<partition>-<attempt>@<stream>.open   being written (by
                                                 the server for a session's stage calls, or by a
                                                 task on the server's host itself: open_local)
    staged/<sink id hex>/<batch id>/<partition>-<attempt>@<stream>.part   complete (fsynced)
    staged/<sink id hex>/<batch id>/owner        the client key (hex) that staged the batch

Every name is durable before a part is acknowledged: the part's data, its rename to ``.part``
(its directory fsynced) and the names of the directories made for it (each new directory's
parent fsynced after its mkdir: ``makedirs_synced``), whatever ``--fsync`` says.

A part file is a sequence of records ``length (uint32) | reserved value (int64) | payload``.

Invariants:

- ``commit(sink, batch)`` appends the named parts, in partition order, to the sink's recording of
  the stream exactly once: the first commit writes ``begin``, frames, fsync, ``done``; any later
  commit of the same ``(sink, batch)`` returns the recorded result and appends nothing.
- A commit may cover several streams (a sink routing rows by a ``stream_id`` column): each
  stream's parts, in partition order, go to that stream's sink recording; one ``begin`` plans
  them all and one ``done`` ends them all, so readers see all of its streams' rows or none, and
  a repeat appends nothing to any of them. A commit naming a ``stream_id`` (every client before
  issue 32) takes only parts of that stream.
- A commit interrupted by a crash is completed on restart (framing is deterministic, so the
  frames already on disk are skipped and the rest appended) before any request is served.
- Readers never see part of a commit: the positions the server reports for a sink recording are
  the end of its last ``done`` commit (``visible_limits``), not the raw recorded end.
- Ownership (with ``--authorized-keys``; issue 28): a batch belongs to the client identity
  (public key) that staged its first part (the ``owner`` file, created exclusively and fsynced),
  a sink id to the identity that first committed it (``owner`` in the commit log's records).
  Staging into, committing or aborting another identity's batch or sink id is refused
  (:class:`NotAuthorisedError`, ``reason="not_owner"``). A part's stream is part of its file
  name, fixed when it is staged (and checked for write permission then): a commit naming it with
  another stream names a file that does not exist.
- Parts not named by a commit (dead attempts, speculative duplicates), parts of aborted batches
  and ``.open`` files of vanished tasks are deleted once untouched for ``lease_s``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, Protocol

import numpy as np

from aeron_spark.connector.errors import (
    ConnectorError,
    ControlProtocolError,
    NotAuthorisedError,
    PayloadTooLargeError,
    StagedDataMissingError,
)
from aeron_spark.connector.server.commitlog import CommitLog
from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.session.records import RECORD, block_records, complete_record, records
from aeron_spark.transport.archive.diskio import (
    create_fresh,
    open_regular,
    read_regular,
    replace_fresh,
)
from aeron_spark.transport.archive.recordings import fsync_dir, makedirs_synced
from aeron_spark.transport.protocol.logbuffer import LogGeometry

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

_READ_BLOCK_BYTES = 4 * 1024 * 1024


def _close_quietly(fh: BinaryIO) -> None:
    """Close a part file whose data no longer matters; its buffered bytes may not fit on a
    full disk (the flush error is dropped: the part is incomplete either way)."""
    try:
        fh.close()
    except OSError:
        with contextlib.suppress(OSError):
            os.close(fh.fileno())


class SinkWriter(Protocol):
    """A recording the committer appends frames to (provided by the server's stream store)."""

    recording_id: int
    session_id: int
    stream_id: int
    geometry: LogGeometry

    @property
    def recorded_position(self) -> int: ...
    def append(self, block: bytes | bytearray | memoryview, position: int, now_ns: int) -> None: ...
    def rollback(self, position: int) -> None: ...
    def force(self) -> None: ...


class SinkRecordings(Protocol):
    def sink_writer(self, stream_id: int, sink_id: str, now_ns: int) -> SinkWriter: ...
    def resume_writer(self, recording_id: int, now_ns: int) -> SinkWriter | None: ...
    def set_visible(self, recording_id: int, position: int) -> None: ...
    def cut_sink_tails(self, visible: dict[int, int]) -> int: ...


@dataclass
class _OpenPart:
    owner: object
    stream_id: int
    fh: Any  # None: the task writes the file itself (open_local / finish_local)
    count: int = 0
    nbytes: int = 0


class PartKey(NamedTuple):
    """What names a staged part: one attempt of one partition of one batch of one sink."""

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: int

    @classmethod
    def of(cls, args: dict[str, Any]) -> PartKey:
        return cls(args["sink_id"], args["batch_id"], args["partition_id"], args["attempt"])

    @property
    def name(self) -> str:
        return f"{self.partition_id}-{self.attempt}"


def _key_dir(root: str, sink_id: str, batch_id: int) -> str:
    return os.path.join(root, sink_id.encode("utf-8").hex(), str(batch_id))


OWNER_FILE = "owner"
_OWNER_MAX_BYTES = 4096  # an owner is a key's hex fingerprint: a bigger file is not read whole


def not_owner(op: str, what: str) -> NotAuthorisedError:
    """The refusal of an operation on a sink batch, sink id or consumer of another client."""
    return NotAuthorisedError(
        f"NOT_AUTHORISED: {op} refused: {what} belongs to another client", op=op, reason="not_owner"
    )


class StagingStore:
    """Staged part files. Not thread-safe: one caller (the server's request loop) at a time."""

    def __init__(self, root: str, max_payload: int | Callable[[int], int] | None = None) -> None:
        self.root = root
        # the sink recordings' largest message, or a stream's (a callable of the stream id;
        # None: no check)
        self.max_payload = max_payload
        makedirs_synced(root)
        self._open: dict[PartKey, _OpenPart] = {}
        self.parts_staged = 0
        self.parts_staged_locally = 0
        self.parts_garbage_collected = 0
        self.bytes_staged = 0
        self.stage_failures = 0  # parts dropped because a write to them failed

    def _file(self, key: PartKey, stream_id: int, suffix: str) -> str:
        return os.path.join(
            _key_dir(self.root, key.sink_id, key.batch_id), f"{key.name}@{stream_id}{suffix}"
        )

    def _create(self, key: PartKey, stream_id: int) -> BinaryIO:
        """The part's ``.open`` file, created empty (its batch directory too)."""
        path = self._file(key, stream_id, ".open")
        # the batch's (and a new sink's) directory durable before a part in it is acknowledged
        # (its name fsynced in its parent: _complete fsyncs only the part's name)
        makedirs_synced(os.path.dirname(path))
        # the staging directory is written by tasks staging locally: a link put at a part's
        # name was followed (its target overwritten with the part), a FIFO stalled the loop
        return open(path, "wb", opener=lambda name, _flags: create_fresh(name))  # noqa: SIM115

    def batch_owner(self, sink_id: str, batch_id: int) -> str | None:
        """The identity (hex) that staged the batch; None when nobody claimed it."""
        # opened as every file of the data directory: a FIFO (open() waited for a writer: the
        # loop hung) or a symlink planted there is refused, NOT_REGULAR_FILE naming it
        path = os.path.join(_key_dir(self.root, sink_id, batch_id), OWNER_FILE)
        try:
            return read_regular(path, _OWNER_MAX_BYTES).decode("ascii", "replace").strip() or None
        except FileNotFoundError:
            return None

    def check_owner(self, sink_id: str, batch_id: int, owner: str | None, op: str) -> None:
        """Refuse ``op`` unless the batch is unclaimed or ``owner``'s (None: no ownership)."""
        if owner is None:
            return
        found = self.batch_owner(sink_id, batch_id)
        if found is not None and found != owner:
            raise not_owner(op, f"batch {batch_id} of sink {sink_id!r}")

    def claim(self, sink_id: str, batch_id: int, owner: str | None, op: str) -> None:
        """Make the batch ``owner``'s if nobody claimed it (durably: the file is written whole
        and fsynced under another name, then renamed in); refuse ``op`` if another identity did.
        None: no ownership (open server). An empty owner file (a crash between the creation and
        the write of the old exclusive create) counts as nobody's, so the next stager claims it
        (it used to stay nobody's for good: any key could then stage into the batch)."""
        if owner is None:
            return
        found = self.batch_owner(sink_id, batch_id)
        if found is not None:
            if found != owner:
                raise not_owner(op, f"batch {batch_id} of sink {sink_id!r}")
            return
        directory = _key_dir(self.root, sink_id, batch_id)
        makedirs_synced(directory)
        path = os.path.join(directory, OWNER_FILE)
        tmp = path + ".tmp"  # one caller at a time (see the class): no other claim races it
        try:
            fd = create_fresh(tmp, 0o600)  # what is there removed, never followed
            try:
                os.write(fd, owner.encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            replace_fresh(tmp, path)  # a directory at the owner's name: NOT_REGULAR_FILE
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(directory)

    def write(
        self,
        owner: object,
        key: PartKey,
        stream_id: int,
        payloads: Sequence[bytes],
        reserved_values: Sequence[int] | None,
        final: bool,
        identity: str | None = None,
    ) -> dict[str, Any] | None:
        """Append payloads to the part ``key``; on ``final`` make it durable and return its
        commit message. The first write of a session to a part (re)creates it, so a retried stage
        call never doubles a part. ``identity``: the client key (hex) the batch must belong to
        (claimed by the first part staged into it); None: no ownership."""
        if reserved_values is not None and len(reserved_values) != len(payloads):
            raise ControlProtocolError("stage: reserved_values and payloads differ in length")
        part = self._open.get(key)
        if part is None or part.owner != owner or part.fh is None:
            self.claim(key.sink_id, key.batch_id, identity, "stage")
            if part is not None and part.fh is not None:
                _close_quietly(part.fh)
            part = _OpenPart(owner, stream_id, self._create(key, stream_id))
            self._open[key] = part
        elif part.stream_id != stream_id:
            raise ControlProtocolError("stage: stream_id changed within one staged part")
        lengths = list(map(len, payloads))
        if lengths:
            self._check_payload(max(lengths), key, stream_id)
        payload_bytes = sum(lengths)
        try:
            part.fh.writelines(records(payloads, reserved_values))
            if final:
                part.fh.flush()
                os.fsync(part.fh.fileno())
        except OSError:
            # disk full or failing: the part is incomplete, so it is dropped (its space freed);
            # the task fails and its retry stages it anew
            self.stage_failures += 1
            self._drop(key, part)
            raise
        part.count += len(payloads)
        part.nbytes += payload_bytes
        self.bytes_staged += payload_bytes + RECORD.size * len(payloads)
        if not final:
            return None
        del self._open[key]
        part.fh.close()
        return self._complete(key, part)

    def _drop(self, key: PartKey, part: _OpenPart) -> None:
        """Forget an open part and delete its file (a failed write left it incomplete)."""
        self._open.pop(key, None)
        if part.fh is not None:
            _close_quietly(part.fh)
        with contextlib.suppress(OSError):
            os.unlink(self._file(key, part.stream_id, ".open"))

    def open_local(
        self, owner: object, key: PartKey, stream_id: int, identity: str | None = None
    ) -> str:
        """(Re)create the part ``key`` empty for a task that writes it itself (records as
        :func:`records` lays them out, then fsync); the path. ``identity`` as for write."""
        self.claim(key.sink_id, key.batch_id, identity, "local_stage")
        part = self._open.pop(key, None)
        if part is not None and part.fh is not None:
            _close_quietly(part.fh)
        with self._create(key, stream_id) as fh:
            path = os.path.abspath(fh.name)
        self._open[key] = _OpenPart(owner, stream_id, None)
        return path

    def finish_local(
        self, owner: object, key: PartKey, stream_id: int, count: int, nbytes: int
    ) -> dict[str, Any]:
        """A task wrote (and fsynced) the part :meth:`open_local` gave this session: check
        every record (whole, ``count`` payloads of ``nbytes`` bytes in all) and complete it.
        A part that does not check out is deleted, with an error naming what was wrong."""
        part = self._open.get(key)
        if part is None or part.owner != owner or part.fh is not None:
            raise ControlProtocolError(
                f"local_stage_done: this session has no part {key.name} of sink "
                f"{key.sink_id!r} batch {key.batch_id} open for writing (ask local_stage first)"
            )
        if part.stream_id != stream_id:
            raise ControlProtocolError("local_stage_done: stream_id differs from local_stage's")
        del self._open[key]
        path = self._file(key, stream_id, ".open")
        try:
            got_count = got_bytes = 0
            for payloads, _rvs in self.read_part(path):
                got_count += len(payloads)
                if isinstance(payloads, np.ndarray):
                    got_bytes += payloads.size
                    self._check_payload(payloads.shape[1], key, stream_id)
                else:
                    lengths = list(map(len, payloads))
                    got_bytes += sum(lengths)
                    self._check_payload(max(lengths, default=0), key, stream_id)
            if (got_count, got_bytes) != (count, nbytes):
                raise StagedDataMissingError(
                    f"the part written locally holds {got_count} payloads of {got_bytes} bytes, "
                    f"the task reported {count} of {nbytes}",
                    part=key.name,
                )
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        part.count, part.nbytes = count, nbytes
        self.bytes_staged += nbytes + RECORD.size * count
        self.parts_staged_locally += 1
        return self._complete(key, part)

    def _check_payload(self, length: int, key: PartKey, stream_id: int) -> None:
        limit = self.max_payload
        if callable(limit):
            limit = limit(stream_id)
        if limit is not None and length > limit:
            raise PayloadTooLargeError(
                f"part {key.name} of sink {key.sink_id!r} batch {key.batch_id} holds a message of "
                f"{length} bytes; stream {stream_id}'s largest is {limit} (min(term_length / 8, "
                "16 MiB))",
                length=length,
                limit=limit,
                stream_id=stream_id,
            )

    def _complete(self, key: PartKey, part: _OpenPart) -> dict[str, Any]:
        path = self._file(key, part.stream_id, ".part")
        os.replace(self._file(key, part.stream_id, ".open"), path)
        fsync_dir(os.path.dirname(path))
        self.parts_staged += 1
        return {
            **key._asdict(),
            "stream_id": part.stream_id,
            "part": key.name,
            "count": part.count,
            "bytes": part.nbytes,
        }

    def release_owner(self, owner: object) -> None:
        """A session went away: close its unfinished parts (left for the lease GC)."""
        for key, part in list(self._open.items()):
            if part.owner == owner:
                if part.fh is not None:
                    _close_quietly(part.fh)  # a full disk must not fail closing a session
                del self._open[key]

    def part_path(self, staged: dict[str, Any], legacy: bool = False) -> str:
        """The part file a commit message names: its name carries the stream it was staged
        for. ``legacy``: also the name without it (parts staged before issue 28, named by a
        commit interrupted by a crash; only recovery asks). The name must be the one its
        partition and attempt give (never a path of the client's choosing)."""
        expected = f"{staged['partition_id']}-{staged['attempt']}"
        if staged["part"] != expected:
            raise ControlProtocolError(
                f"staged part name {staged['part']!r} does not match its "
                f"partition and attempt ({expected!r})"
            )
        directory = _key_dir(self.root, staged["sink_id"], staged["batch_id"])
        path = os.path.join(directory, f"{staged['part']}@{staged['stream_id']}.part")
        if legacy and not os.path.exists(path):
            old = os.path.join(directory, staged["part"] + ".part")
            if os.path.exists(old):
                return old
        return path

    def check_part(self, staged: dict[str, Any], legacy: bool = False) -> str:
        path = self.part_path(staged, legacy)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise StagedDataMissingError(
                f"staged part {staged['part']} of sink {staged['sink_id']!r} batch "
                f"{staged['batch_id']} for stream {staged['stream_id']} is not on the server "
                "(aborted, garbage collected after its lease, never completed, or staged for "
                "another stream)",
                part=staged["part"],
            ) from None
        if size != staged["bytes"] + RECORD.size * staged["count"]:
            raise StagedDataMissingError(
                f"staged part {staged['part']} has {size} bytes on disk, the commit message "
                f"describes {staged['count']} payloads of {staged['bytes']} bytes",
                part=staged["part"],
            )
        return path

    def read_part(self, path: str) -> Iterator[tuple[Any, Any]]:
        """Payloads and reserved values of a part file, in bounded batches, in order: lists of
        payloads, or (for runs of equal-length payloads) a 2-D uint8 array with a row per
        payload and an int64 array of reserved values, read without Python per payload."""
        # not following a symlink planted in its place (a commit recorded its target's bytes)
        with os.fdopen(open_regular(path), "rb") as fh:
            carry = b""
            while True:
                if carry:  # the record that straddled the last block's end: only it is copied
                    record = complete_record(fh, carry, path)
                    _length, rv = RECORD.unpack_from(record, 0)
                    yield [memoryview(record)[RECORD.size :]], [rv]
                    carry = b""
                # what is left, at most a block: a read of 4 MiB allocates 4 MiB before it
                # reads (a commit of a few small rows did, every commit)
                left = os.fstat(fh.fileno()).st_size - fh.tell()
                data = fh.read(min(_READ_BLOCK_BYTES, left)) if left > 0 else b""
                if not data:
                    break
                offset = yield from block_records(data)
                carry = data[offset:]

    def discard(
        self, sink_id: str, batch_id: int, parts: Sequence[dict[str, Any]] | None = None
    ) -> int:
        """Delete the parts of a batch that commit messages name (all of it when ``parts`` is
        None).

        Returns the number of files deleted."""
        directory = _key_dir(self.root, sink_id, batch_id)
        if not os.path.isdir(directory):
            return 0
        if parts is None:
            count = len([n for n in os.listdir(directory) if n != OWNER_FILE])
            shutil.rmtree(directory, ignore_errors=True)
            return count
        count = 0
        for part in parts:
            try:
                os.unlink(self.part_path(part))
                count += 1
            except FileNotFoundError:
                pass
        return count

    def gc(self, now_wall_s: float, lease_s: float, protected: set[tuple[str, int]]) -> int:
        """Delete part files untouched for ``lease_s`` (except open ones and batches in
        ``protected``, i.e. commits in progress). Returns the number of files deleted."""
        open_keys = {(s, b) for (s, b, _p, _a) in self._open}
        deleted = 0
        for sink_hex in os.listdir(self.root):
            sink_dir = os.path.join(self.root, sink_hex)
            try:
                sink_id = bytes.fromhex(sink_hex).decode("utf-8")
            except ValueError:
                continue
            for batch in os.listdir(sink_dir):
                batch_dir = os.path.join(sink_dir, batch)
                if not batch.isdigit() or (sink_id, int(batch)) in protected:
                    continue
                busy = (sink_id, int(batch)) in open_keys
                for name in os.listdir(batch_dir):
                    if name == OWNER_FILE:  # goes with the batch's last part
                        continue
                    path = os.path.join(batch_dir, name)
                    try:
                        age = now_wall_s - os.path.getmtime(path)
                    except FileNotFoundError:
                        continue
                    if age >= lease_s and not (busy and name.endswith(".open")):
                        os.unlink(path)
                        deleted += 1
                owner = os.path.join(batch_dir, OWNER_FILE)
                if os.listdir(batch_dir) == [OWNER_FILE] and not busy:
                    with contextlib.suppress(FileNotFoundError):
                        if now_wall_s - os.path.getmtime(owner) >= lease_s:
                            os.unlink(owner)
                if not os.listdir(batch_dir):
                    os.rmdir(batch_dir)
            if not os.listdir(sink_dir):
                os.rmdir(sink_dir)
        self.parts_garbage_collected += deleted
        return deleted

    def close(self) -> None:
        for part in self._open.values():
            if part.fh is not None:
                _close_quietly(part.fh)
        self._open.clear()


def _targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The streams a commit log record covers: its ``streams`` (a commit of several streams),
    or the one stream of the record's own fields."""
    if "streams" in record:
        return list(record["streams"])
    return [record]


#: Commits remembered per sink id (their results answer a repeated commit).
DONE_WINDOW = 64
#: The commit log is compacted when it grows past this and twice its size after the last one.
COMPACT_MIN_BYTES = 1 << 20


class SinkCommitter:
    """Exactly-once commits of staged parts, driven by the commit log.

    Bounded (issue 31 item 6: every committed batch stayed in memory, ~450 bytes each, and in the
    log forever): a sink id's last ``done_window`` commits are remembered (a repeated commit of
    one of them returns its result and appends nothing, as always); a sink whose batch ids only
    ever grew (a streaming query: Spark repeats at most its last batch) answers a batch id below
    its window as committed (``"forgotten": true``, nothing appended), Delta's rule for
    ``txnVersion``; a sink with batch ids in no order (batch writes draw one at random) has its
    window only. The commit log is compacted to what is remembered plus, per sink recording, the
    commit that made its visible end, when it passed twice its compacted size."""

    def __init__(
        self,
        directory: str,
        recordings: SinkRecordings,
        max_payload: int | Callable[[int], int] | None = None,
        done_window: int = DONE_WINDOW,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
    ) -> None:
        makedirs_synced(directory)
        self.staging = StagingStore(os.path.join(directory, "staged"), max_payload)
        self.log = CommitLog(os.path.join(directory, "commit.log"))
        self.recordings = recordings
        self.done_window = max(1, done_window)
        self.compact_min_bytes = compact_min_bytes
        self.done: dict[tuple[str, int], dict[str, Any]] = {}  # the windows' commits
        self._window: dict[str, deque[int]] = {}  # sink id -> its remembered batch ids, in order
        self._unordered: set[str] = set()  # sink ids whose batch ids did not always grow
        self._visible_by: dict[int, tuple[str, int]] = {}  # recording -> commit of its end
        self.forgotten_commits = 0  # repeated commits of batches below a window
        self.last_batch: dict[str, int] = {}
        self.sink_owner: dict[str, str] = {}  # sink id -> identity (hex) that first committed it
        self.visible: dict[int, int] = {}
        self._pending: dict[tuple[str, int], dict[str, Any]] = {}
        self._active: tuple[str, int] | None = None  # the commit running now (another thread)
        # cancel records of failed commits not yet in the log (it was full): written before any
        # other record, so a failed begin is never followed by another commit's records
        self._cancels: list[dict[str, Any]] = []
        self.failed_commits = 0
        self.commits = 0
        self.duplicate_commits = 0
        self.resumed_commits = 0
        self.tail_bytes_cut = 0  # bytes past sink recordings' visible ends cut at recovery
        self.aborts = 0
        for record in self.log.records:
            key = (record["sink_id"], record["batch_id"])
            if record.get("owner"):
                self.sink_owner.setdefault(record["sink_id"], record["owner"])
            if record["t"] == "begin":
                self._pending[key] = record
            elif record["t"] == "done":
                self._pending.pop(key, None)
                self._mark_done(record)
            elif record["t"] == "cancel":
                self._pending.pop(key, None)
        self.log.records = []  # taken: not kept for the server's life
        self._compacted_size = self.log.size

    def _mark_done(self, record: dict[str, Any]) -> None:
        key = (record["sink_id"], record["batch_id"])
        if "streams" in record:  # a commit of several streams (a routing sink; issue 32)
            result = {k: record[k] for k in ("sink_id", "batch_id", "count", "bytes")}
            result["streams"] = [dict(t) for t in record["streams"]]
        else:
            result = {
                k: record[k]
                for k in (
                    "sink_id",
                    "batch_id",
                    "stream_id",
                    "recording_id",
                    "start_position",
                    "end_position",
                    "count",
                    "bytes",
                )
            }
        sink_id = key[0]
        self.done[key] = result
        window = self._window.setdefault(sink_id, deque())
        if window and key[1] <= self.last_batch.get(sink_id, -1):
            self._unordered.add(sink_id)  # batch ids in no order: its window is all it has
        window.append(key[1])
        while len(window) > self.done_window:
            self.done.pop((sink_id, window.popleft()), None)
        if record.get("owner"):
            self.sink_owner.setdefault(sink_id, record["owner"])
        self.last_batch[sink_id] = max(self.last_batch.get(sink_id, -1), key[1])
        for target in _targets(record):
            rid = target["recording_id"]
            if target["end_position"] >= self.visible.get(rid, -1):
                self.visible[rid] = target["end_position"]
                self._visible_by[rid] = key
            self.recordings.set_visible(rid, self.visible[rid])

    def recording_ids(self) -> set[int]:
        """Every recording the commit log names (committed ends, commits to resume)."""
        pending = {t["recording_id"] for b in self._pending.values() for t in _targets(b)}
        return set(self.visible) | pending

    def _forgotten(self, sink_id: str, batch_id: int) -> bool:
        """Was ``batch_id`` committed, before the sink's window? Known only for a sink whose
        batch ids only grew and whose window is full (anything below it was committed)."""
        window = self._window.get(sink_id)
        return (
            window is not None
            and len(window) >= self.done_window
            and sink_id not in self._unordered
            and batch_id < window[0]
        )

    def _maybe_compact(self) -> None:
        """Rewrite the log with what is remembered, once it doubled since the last time."""
        size = self.log.size
        if size < max(self.compact_min_bytes, 2 * self._compacted_size):
            return
        if self._pending or self._cancels:  # a begin still to resume or cancel: not now
            return
        keep = set(self.done) | set(self._visible_by.values()) | set(self.last_batch.items())
        owners = self.sink_owner

        def kept(record: dict[str, Any]) -> dict[str, Any] | None:
            if record.get("t") != "done" or (record["sink_id"], record["batch_id"]) not in keep:
                return None
            owner = owners.get(record["sink_id"])
            return dict(record, owner=owner) if owner else record

        try:
            self._compacted_size = self.log.compact(kept)
        except OSError as exc:  # a full disk: the log stays as it was, tried again later
            log.warning("cannot compact the sink commit log (kept as it is): %s", exc)
            self._compacted_size = size

    def recover(self, now_ns: int) -> int:
        """Complete every commit a crash interrupted. Returns how many were resumed.

        A commit that cannot be completed now (the disk is full, its staged parts are gone) is
        cut off and cancelled as a commit a full disk fails while running is (:meth:`_fail`;
        counted in ``failed_commits``): its client was never told it committed, and its retry
        commits it once. It never keeps the server from starting (before, the server exited
        and served nothing, not even what was committed)."""
        for rid, position in self.visible.items():
            self.recordings.set_visible(rid, position)
        # what lies past a sink recording's committed end is no commit's: a failed commit whose
        # cut failed too, or an interrupted one (resumed below from its start, re-planned at
        # the visible end if it began past it). Left there, the next commit would start after
        # it and its done would make it visible
        self.tail_bytes_cut += self.recordings.cut_sink_tails(self.visible)
        resumed = 0
        for key, begin in list(self._pending.items()):
            writers: dict[int, SinkWriter] = {}
            try:
                begin = self._resume(begin, writers, now_ns)
                self._run(begin, writers, now_ns)
            except (OSError, ConnectorError) as exc:
                log.warning(
                    "cannot complete the commit of sink %r batch %s a crash interrupted "
                    "(cancelled; its retry commits it): %s",
                    key[0],
                    key[1],
                    exc,
                )
                self._fail(key, begin, writers)
            else:
                resumed += 1
            del self._pending[key]
        self.resumed_commits += resumed
        return resumed

    def _resume(
        self, begin: dict[str, Any], writers: dict[int, SinkWriter], now_ns: int
    ) -> dict[str, Any]:
        """The writers of an interrupted commit's recordings (into ``writers``) and its plan: a
        recording that lost the commit's start is replaced by a new one (planned anew)."""
        moved = False
        targets = []
        for target in _targets(begin):
            writer = self.recordings.resume_writer(target["recording_id"], now_ns)
            if writer is None or writer.recorded_position < target["start_position"]:
                writer = self.recordings.sink_writer(target["stream_id"], begin["sink_id"], now_ns)
                target = dict(
                    target,
                    recording_id=writer.recording_id,
                    session_id=writer.session_id,
                    start_position=writer.recorded_position,
                )
                moved = True
            writers[target["stream_id"]] = writer
            targets.append(target)
        if moved:
            if "streams" in begin:
                begin = dict(begin, streams=targets)
            else:
                begin = dict(begin, **targets[0])
            self.log.append(begin)
        return begin

    def check_sink_owner(self, sink_id: str, owner: str | None, op: str) -> None:
        """Refuse ``op`` on a sink id another identity committed first (None: no ownership)."""
        if owner is None:
            return
        found = self.sink_owner.get(sink_id)
        if found is not None and found != owner:
            raise not_owner(op, f"sink {sink_id!r}")

    def check_owner(self, sink_id: str, batch_id: int, owner: str | None, op: str) -> None:
        """Refuse ``op`` on another identity's sink id or staged batch."""
        self.check_sink_owner(sink_id, owner, op)
        self.staging.check_owner(sink_id, batch_id, owner, op)

    def last_committed_batch(self, sink_id: str, owner: str | None = None) -> int | None:
        self.check_sink_owner(sink_id, owner, "last_committed_batch")
        return self.last_batch.get(sink_id)

    def commit(
        self,
        sink_id: str,
        batch_id: int,
        stream_id: int | None,
        staged: list[dict[str, Any]],
        now_ns: int,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Commit the named parts (see the module docs). ``stream_id``: every part is of that
        stream (the commit of one stream); None: the parts may be of several streams, each
        stream's parts appended to its own sink recording, all in one commit (a sink routing
        rows by a ``stream_id`` column). ``owner``: the committing client's identity (hex),
        which must own the batch and the sink id (None: no ownership)."""
        key = (sink_id, batch_id)
        self.check_owner(sink_id, batch_id, owner, "commit")
        previous = self.done.get(key)
        if previous is not None:
            self.duplicate_commits += 1
            self.staging.discard(sink_id, batch_id)
            return dict(previous)
        if self._forgotten(sink_id, batch_id):  # committed before the window: as a repeat
            self.duplicate_commits += 1
            self.forgotten_commits += 1
            self.staging.discard(sink_id, batch_id)
            return {"sink_id": sink_id, "batch_id": batch_id, "forgotten": True}
        by_part: dict[tuple[int, int], dict[str, Any]] = {}  # (stream, partition) -> part
        attempts: dict[int, int] = {}  # partition -> the one attempt its parts come from
        for item in staged:
            if item["sink_id"] != sink_id or item["batch_id"] != batch_id:
                raise NotAuthorisedError(
                    f"commit of sink {sink_id!r} batch {batch_id} names a part of sink "
                    f"{item['sink_id']!r} batch {item['batch_id']}"
                )
            if stream_id is not None and item["stream_id"] != stream_id:
                raise ControlProtocolError(
                    f"commit to stream {stream_id} names a part staged for "
                    f"stream {item['stream_id']}"
                )
            slot = (item["stream_id"], item["partition_id"])
            other = by_part.get(slot)
            if other is not None and other != item:
                raise ControlProtocolError(
                    f"commit names two attempts of partition {item['partition_id']} "
                    f"({other['part']} and {item['part']}) for stream {item['stream_id']}"
                )
            by_part[slot] = item
            attempt = attempts.setdefault(item["partition_id"], item["attempt"])
            if attempt != item["attempt"]:
                raise ControlProtocolError(
                    f"commit names two attempts of partition {item['partition_id']} "
                    f"({attempt} and {item['attempt']}) for different streams"
                )
        parts = [by_part[slot] for slot in sorted(by_part)]  # by stream, then partition
        for item in parts:
            self.staging.check_part(item)
        streams = [stream_id] if stream_id is not None else sorted({s for s, _p in by_part})
        writers = {s: self.recordings.sink_writer(s, sink_id, now_ns) for s in streams}
        targets = [
            {
                "stream_id": s,
                "recording_id": w.recording_id,
                "session_id": w.session_id,
                "start_position": w.recorded_position,
            }
            for s, w in writers.items()
        ]
        begin: dict[str, Any] = {"t": "begin", "sink_id": sink_id, "batch_id": batch_id}
        if stream_id is not None:  # the one-stream record, as before issue 32
            begin.update(targets[0])
        else:
            begin["streams"] = targets
        begin.update(parts=parts, owner=owner or "")
        self._write_cancels()
        self.log.append(begin)
        self._active = key
        try:
            result = self._run(begin, writers, now_ns)
        except BaseException:
            self._fail(key, begin, writers)
            raise
        finally:
            self._active = None
        self.commits += 1
        return result

    def _fail(
        self, key: tuple[str, int], begin: dict[str, Any], writers: dict[int, SinkWriter]
    ) -> None:
        """A commit failed (disk full, I/O error) before its ``done``: cut its frames off the
        recordings and cancel its ``begin``, so nothing of it is visible, now or after a
        restart, and the client's retry commits it from the start (its staged parts are kept)."""
        if key in self.done:
            return
        self.failed_commits += 1
        for target in _targets(begin):
            writer = writers.get(target["stream_id"])
            if writer is None:  # never opened (recovery failed before): nothing to cut
                continue
            try:
                writer.rollback(target["start_position"])
            except Exception:  # noqa: BLE001 - reported; the next append overwrites what is left
                log.exception("cannot cut a failed commit of %s off its recording", key)
        self._cancels.append(
            {"t": "cancel", "sink_id": begin["sink_id"], "batch_id": begin["batch_id"]}
        )
        with contextlib.suppress(OSError):
            self._write_cancels()

    def _write_cancels(self) -> None:
        while self._cancels:
            self.log.append(self._cancels[0])
            self._cancels.pop(0)

    def _run(
        self, begin: dict[str, Any], writers: dict[int, SinkWriter], now_ns: int
    ) -> dict[str, Any]:
        legacy = "owner" not in begin
        done_targets = []
        total_count = total_bytes = 0
        for target in _targets(begin):
            writer = writers[target["stream_id"]]
            start = target["start_position"]
            already = writer.recorded_position
            # each block is written out before the next is framed: the framer may reuse its
            # buffer
            framer = Framer(
                writer.geometry, target["session_id"], target["stream_id"], start, reuse_blocks=True
            )
            count = nbytes = 0
            for item in begin["parts"]:
                if item["stream_id"] != target["stream_id"]:
                    continue
                path = self.staging.check_part(item, legacy=legacy)
                for payloads, rvs in self.staging.read_part(path):
                    count += len(payloads)
                    nbytes += (
                        payloads.size
                        if isinstance(payloads, np.ndarray)
                        else sum(map(len, payloads))
                    )
                    for position, block in framer.frame(payloads, rvs):
                        end = position + len(block)
                        if end <= already:
                            continue
                        if position < already:  # resume inside this block (on a frame boundary)
                            block = block[already - position :]
                            position = already
                        writer.append(block, position, now_ns)
            done_targets.append(
                {
                    "stream_id": target["stream_id"],
                    "recording_id": writer.recording_id,
                    "start_position": start,
                    "end_position": framer.position,
                    "count": count,
                    "bytes": nbytes,
                }
            )
            total_count += count
            total_bytes += nbytes
        for writer in writers.values():
            writer.force()
        done: dict[str, Any] = {
            "t": "done",
            "sink_id": begin["sink_id"],
            "batch_id": begin["batch_id"],
        }
        if "streams" in begin:
            done["streams"] = done_targets
            done.update(count=total_count, bytes=total_bytes)
        else:
            done.update(done_targets[0])
        done["owner"] = begin.get("owner", "")
        self.log.append(done)
        self._mark_done(done)
        result = dict(self.done[(begin["sink_id"], begin["batch_id"])])
        self.staging.discard(begin["sink_id"], begin["batch_id"])
        self._maybe_compact()
        return result

    def abort(
        self, sink_id: str, batch_id: int, staged: list[dict[str, Any]], owner: str | None = None
    ) -> int:
        """Discard the named parts (a committed batch is left as it is). Returns files deleted.
        ``owner`` as for :meth:`commit`."""
        self.check_owner(sink_id, batch_id, owner, "abort")
        for item in staged:
            if item["sink_id"] != sink_id or item["batch_id"] != batch_id:
                raise NotAuthorisedError(
                    f"abort of sink {sink_id!r} batch {batch_id} names a part of sink "
                    f"{item['sink_id']!r} batch {item['batch_id']}"
                )
        self.aborts += 1
        return self.staging.discard(sink_id, batch_id, staged)

    def gc(self, now_wall_s: float, lease_s: float) -> int:
        protected = set(self._pending)
        protected.update((c["sink_id"], c["batch_id"]) for c in self._cancels)
        active = self._active
        if active is not None:
            protected.add(active)
        return self.staging.gc(now_wall_s, lease_s, protected)

    def close(self) -> None:
        self.staging.close()
        self.log.close()


__all__ = [
    "OWNER_FILE",
    "not_owner",
    "PartKey",
    "SinkCommitter",
    "SinkRecordings",
    "SinkWriter",
    "StagingStore",
    "records",
]

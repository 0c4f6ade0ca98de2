"""Recordings on disk: segment files, a sparse position/time index, purge, crash recovery.

The archive's storage engine (used by the stream server through
:class:`~aeron_spark.connector.server.store.ArchiveStore`, and on its own with
:class:`~aeron_spark.transport.archive.recorder.Recorder`). It keeps Aeron's layout rules: a
recording holds an image's raw frames at their stream positions, exactly as they were in the log
buffer (PAD frames included).

Layout of one recording, ``<dir>/recordings/<id>/``::

    meta.msgpack        descriptor written (fsynced) at creation, never changed
    stop.msgpack        {stop_position, stop_timestamp_ns} once stopped (absent while recording)
    purged.msgpack      {purged_position} after a purge
    acked               (position int64, ~position int64): the end of what the writer
                        acknowledged (server publish recordings only: written after a publish's
                        frames, before its answer); recovery cuts complete frames past it
    index               records (position int64, timestamp_ns int64): frame boundaries with the
                        time they were recorded, one per append at most every INDEX_INTERVAL;
                        read from the file, not held in memory (:mod:`.timeindex`)
    <base>.seg          stream bytes [base, base + segment_length), base a multiple of it

Invariants:

- Bytes are only appended, in position order, with ``pwrite`` on files that are never
  preallocated, so after ``kill -9`` a segment's size bounds what was written. Recovery walks the
  frames from the last indexed boundary and stops at the first frame that is not complete within
  the file (or whose header disagrees with its position): the torn tail is cut off, every complete
  frame before it is kept. A recording the crash left live that has no acknowledged end (a
  recorded image's, see :mod:`.recorder`) is then cut back to the end of its last whole message
  (:meth:`Recording.cut_incomplete_message`): a fragmented message whose last fragments never
  came is no message, and a reader takes a recording from message boundary to message boundary.
- Every index position is a frame boundary; a replay position is checked by walking frames from
  the nearest indexed boundary below it (never more than about INDEX_INTERVAL_BYTES).
- ``purged_position`` only grows; segments wholly below it are deleted.
- ``recorded_position`` never passes what is in the files: an append writes all its bytes
  (short writes are continued) or raises after cutting them off again (:meth:`Recording.append`).
- A recording holds no file descriptor of its own: segment and index files are opened on demand
  through a bounded cache shared by the store (:class:`~.fdcache.FdCache`), and a stopped
  recording's are closed at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import shutil
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from aeron_spark.transport.archive.diskio import (
    IOV_MAX,
    Gathered,
    create_fresh,
    pwritev_all,
    read_regular,
    replace_fresh,
)
from aeron_spark.transport.archive.diskio import pwrite_all as _pwrite_all
from aeron_spark.transport.archive.errors import (
    IdMarkCorruptError,
    NotFrameBoundaryError,
    NotRegularFileError,
    PositionOutOfRangeError,
    PurgedError,
    UnknownRecordingError,
)
from aeron_spark.transport.archive.fdcache import FdCache
from aeron_spark.transport.archive.spares import FILES as SPARE_FILES
from aeron_spark.transport.archive.spares import META as SPARE_META
from aeron_spark.transport.archive.spares import OLD_META as OLD_SPARE_META
from aeron_spark.transport.archive.spares import Spare, SparePool
from aeron_spark.transport.archive.timeindex import TimeIndex
from aeron_spark.transport.protocol.frames import (
    FRAME_ALIGNMENT,
    FRAME_HEAD,
    DataFlags,
    FrameType,
    uniform_run,
)
from aeron_spark.transport.protocol.logbuffer import compute_position

_head_from = FRAME_HEAD.unpack_from  # frame_length, version, flags, type, term_offset
_PAD = int(FrameType.PAD)
_DATA = int(FrameType.DATA)
_BEGIN = int(DataFlags.BEGIN)
_END = int(DataFlags.END)
_UNFRAGMENTED = int(DataFlags.UNFRAGMENTED)
INDEX_INTERVAL_BYTES = 64 * 1024
INDEX_INTERVAL_NS = 1_000_000
_ACKED = struct.Struct("<qq")  # position, ~position (a torn or damaged file is told apart)
# The high-water mark of recording ids: every id below it may have been issued. Written (whole,
# renamed in, its directory fsynced) before an id at or past it is used, ID_BLOCK ids at a time
# (two fsyncs per ID_BLOCK recordings, the first block at open); a restart starts past it, so an
# id is never issued twice, even when the newest recordings' directories were deleted (their
# consumer positions, sink commits and replays would have applied to the new recording).
ID_MARK_FILE = "next_id.msgpack"
ID_BLOCK = 256
# A mark above this is damaged, not a store's: recording ids are Aeron's int64 (Spark's
# ``recording_id long``), and a mark this high leaves 2**32 ids before the last one. Without
# the bound a mark of 2**64 - 1 (one bit flipped in a uint64) stopped the start with a bare
# OverflowError, and one of 2**63 - 3 was taken: the fourth id issued was past int64.
ID_MARK_MAX = 2**63 - 2**32

log = logging.getLogger(__name__)


def fsync_dir(path: str) -> None:
    """fsync a directory, so a file created or renamed in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_synced(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, each directory it creates durable: the parent of
    each new directory is fsynced after its mkdir (else a power cut may lose a new directory's
    name, and with it all that was fsynced inside). A path that exists costs one ``stat``."""
    missing: list[str] = []
    at = os.path.abspath(path)
    while not os.path.isdir(at):
        missing.append(at)
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    for directory in reversed(missing):  # the outermost first
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
    for directory in reversed(missing):
        fsync_dir(os.path.dirname(directory))


@dataclass
class Descriptor:
    recording_id: int
    stream_id: int
    session_id: int
    source: str
    start_position: int
    start_timestamp_ns: int
    initial_term_id: int
    term_length: int
    mtu: int
    segment_length: int


def _write_meta(path: str, body: dict[str, Any], sync: bool = True) -> None:
    """Write ``path`` whole (a temporary file renamed in); fsynced with its directory when
    ``sync``, else left to the caller (:class:`MetaSyncer`)."""
    tmp = path + ".tmp"
    with os.fdopen(create_fresh(tmp), "wb") as fh:  # what is there removed, never followed
        fh.write(msgpack.packb(body))
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    replace_fresh(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(path))


class MetaSyncer:
    """fsyncs new recordings' descriptors (``meta.msgpack``, its directory and the recordings'
    directory) on a thread of its own, in batches (one fsync of the shared directory a batch).

    Without ``--fsync`` a recording's data is never fsynced by the appends, so its descriptor
    need not be before the first append either: creating a recording cost two fsyncs on the
    server's event loop (4 ms each on this machine's disk), and the first publish of 512
    sessions stalled the loop for seconds (issue 31 item 1). The descriptor is still written
    whole and renamed in at once (a crash of the process leaves it or nothing), and is fsynced
    moments later. With ``--fsync`` the store fsyncs it at once, as before."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.synced = 0
        self.failures = 0  # paths gone (purged) or a failing disk: counted, never raised

    def submit(self, meta_path: str) -> None:
        with self._lock:  # the put too: the thread ends only with the queue empty, under it
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="aeron-spark-meta-sync", daemon=True
                )
                self._thread.start()
            self._queue.put(meta_path)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=1.0)
            except queue.Empty:
                with self._lock:  # idle a second: the thread ends (the next submit starts one)
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if first is None:
                return
            batch = [first]
            stop = False
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            directories: dict[str, None] = {}
            for path in batch:
                self._sync(path, file=True)
                directory = os.path.dirname(path)
                directories[directory] = None
                directories[os.path.dirname(directory)] = None
            for directory in directories:
                self._sync(directory, file=False)
            if stop:
                return

    def _sync(self, path: str, file: bool) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            self.failures += 1
            return
        try:
            os.fsync(fd)
            self.synced += file
        except OSError:
            self.failures += 1
        finally:
            os.close(fd)

    def close(self, timeout_s: float = 30.0) -> None:
        """Sync what was submitted, then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout_s)


def _listdir(path: str) -> list[str]:
    """The names in ``path`` ([] if it is not a directory one can list)."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def _empty_regular(path: str) -> bool:
    """``path`` is an empty regular file (a FIFO's size is 0 too, and is not a spare's)."""
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def _nothing_recorded(path: str) -> bool:
    """``path`` (a recording directory without a readable descriptor) holds no data: only the
    names a spare holds (:mod:`.spares`), all empty, an older version's descriptor temporary
    file, or nothing."""
    try:
        names = os.listdir(path)
        return all(
            name == OLD_SPARE_META
            or (name in SPARE_FILES and _empty_regular(os.path.join(path, name)))
            for name in names
        )
    except OSError:
        return False


def _read_meta(path: str) -> dict[str, Any] | None:
    """The msgpack body of ``path``; None without one. A FIFO, device or symlink there raises
    :class:`NotRegularFileError` at once (before, ``open`` of a FIFO blocked the start)."""
    try:
        data = read_regular(path)
    except FileNotFoundError:
        return None
    return msgpack.unpackb(data, raw=False)


def _read_descriptor(path: str) -> Descriptor | None:
    """The descriptor of recording directory ``path``; None when it has none that reads: lost
    (a crash before it was written), damaged (a failing disk, a power cut before its fsync: an
    empty or torn file, or not a descriptor), or ``path`` is no directory. Before, a damaged one
    stopped the store's start with a bare msgpack or TypeError, and a file with a digit name
    with NotADirectoryError, though such a directory is to be left as it is and its id never
    issued again."""
    try:
        meta = _read_meta(os.path.join(path, "meta.msgpack"))
        if meta is None:
            return None
        d = Descriptor(**meta)
    except (OSError, ValueError, TypeError, msgpack.UnpackException) as exc:
        log.warning("recording descriptor %s is unreadable: %s", path, exc)
        return None
    ints = [v for k, v in d.__dict__.items() if k != "source"]
    if not isinstance(d.source, str) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in ints
    ):
        log.warning("recording descriptor %s is not a descriptor: %r", path, meta)
        return None
    return d


def _uniform_prefix(chunk: bytes, n: int) -> int:
    """Bytes of the run of whole DATA frames of one length that ``chunk`` starts with, checked
    with numpy (streams of equal-length messages are common; walking them frame by frame in
    Python costs about a microsecond each)."""
    if n < 32 * 8:
        return 0
    length, _v, _f, ftype, _o = _head_from(chunk, 0)
    if length <= 0 or ftype != _DATA:
        return 0
    aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
    if n // aligned < 8:
        return 0
    return uniform_run(chunk, 0, length, unfragmented=False, max_frames=n // aligned) * aligned


def _whole_frames(chunk: bytes, position: int, limit: int) -> tuple[int, bytes] | None:
    """The whole frames ``chunk`` (read at ``position``) starts with, without PAD: ``(end
    position, frames)``, the end past a trailing PAD frame; None when it holds no whole frame."""
    n = len(chunk)
    i = data_end = _uniform_prefix(chunk, n)
    while i + 32 <= n:
        length, _v, _f, ftype, _o = _head_from(chunk, i)
        if length <= 0:
            break
        aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        if ftype == _PAD:
            if position + i + aligned <= limit:
                return position + i + aligned, chunk[:i]
            break
        if i + aligned > n:
            break
        i += aligned
        data_end = i
    if data_end == 0:
        return None
    return position + data_end, chunk[:data_end]


class Recording:
    """One recording: append (while recording), read, check boundaries, purge."""

    def __init__(
        self,
        directory: str,
        descriptor: Descriptor,
        fsync: bool,
        *,
        read_only: bool = False,
        index_range: tuple[int, int | None] | None = None,
        fds: FdCache | None = None,
        stops_pending: dict[int, Recording] | None = None,
        fresh: bool = False,
        spare: bool = False,
    ) -> None:
        """``fresh``: the directory was made just now and holds only the descriptor, so there
        is nothing to recover, no stop or purge file to read (the store's ``create``; issue
        31: a stream server's 2,048 sessions each create one on their first publish, and the
        looks for files that cannot be there were half of each creation's cost). ``spare``:
        it is a spare renamed in (:mod:`.spares`): its ``acked``, ``index`` and first segment
        files exist, empty, their names durable."""
        self.directory = directory
        # the index's and acked file's paths, and the last segment's, joined once (a publish
        # wrote all three: issue 31)
        self._paths = (os.path.join(directory, "index"), os.path.join(directory, "acked"))
        self._last_segment = (-1, "")
        # the store's recordings whose stop file is not written yet (joined while pending), so
        # its retry walks those, not every recording (issue 31 item 4)
        self._stops_pending = stops_pending
        self.d = descriptor
        self.fsync = fsync
        self.read_only = read_only
        self.shift = descriptor.term_length.bit_length() - 1
        self.recorded_position = descriptor.start_position
        stop = None if fresh else _read_meta(os.path.join(directory, "stop.msgpack"))
        self.stop_position: int | None = None if stop is None else int(stop["stop_position"])
        purged = None if fresh else _read_meta(os.path.join(directory, "purged.msgpack"))
        self.purged_position = (
            descriptor.start_position if purged is None else int(purged["purged_position"])
        )
        # descriptors come from a cache shared by the store (bounded, least recently used), so a
        # recording holds none while no one reads or appends it
        self._own_files = fds is None
        self._files = FdCache(8) if fds is None else fds
        self._dirty: set[int] = set()  # segment bases written since the last force()
        # segment bases known to exist (no stat per append)
        self._present: set[int] = {0} if spare else set()
        # the acked file is known to exist (this writer wrote it, or a spare held it): no stat
        # per acknowledge
        self._acked_written = spare
        self._index_present = spare  # the index file is known to exist (a spare held it)
        self._dir_dirty = False  # a file was created here since the directory's last fsync
        self._index_dirty = False
        self.stop_pending = False  # stopped, but stop.msgpack is not written yet (disk full)
        self._stop_ns = 0
        self.torn_bytes_cut = 0
        self.unacknowledged_bytes_cut = 0  # complete frames past the acked end cut at recovery
        self.short_writes = 0  # pwrite wrote less than asked (the rest was retried)
        self.failed_appends = 0  # appends that failed (ENOSPC, EIO, ...) and were rolled back
        self.cut_failures = 0  # a rollback could not truncate its bytes away (see _cut)
        self.has_acked_end = False  # an ``acked`` file was found at recovery (publish recordings)
        # the position/time index stays on disk (see timeindex.py); a read-only view of a
        # range another process reported recorded considers only the entries below its end
        self.index = TimeIndex(
            self._index_path,
            self._files.use,
            limit_position=None if index_range is None else index_range[1],
            empty=fresh,  # nothing to read (a spare's is empty): no open, no cached descriptor
        )
        if not read_only and not fresh:
            self._recover()

    @classmethod
    def open_read_only(cls, directory: str, start: int = 0, end: int | None = None) -> Recording:
        """Open a recording another process writes, to read ``[start, end)``, a range it has
        reported recorded.

        Nothing is recovered or written: the segment files are opened read-only, and of the index
        (sorted by position, a binary search finds ``start``) only the entries that time that
        range are read, as they are now: the writer indexes an append before it counts it
        recorded, so they are all there."""
        meta = _read_meta(os.path.join(directory, "meta.msgpack"))
        if meta is None:
            raise UnknownRecordingError(f"no recording in {directory} (no meta.msgpack)")
        return cls(directory, Descriptor(**meta), False, read_only=True, index_range=(start, end))

    # --- files --------------------------------------------------------------------------------

    def _segment_base(self, position: int) -> int:
        return position - position % self.d.segment_length

    def _segment_path(self, base: int) -> str:
        if base == self._last_segment[0]:  # the one appended to (a publish's: issue 31)
            return self._last_segment[1]
        path = os.path.join(self.directory, f"{base:020d}.seg")
        self._last_segment = (base, path)
        return path

    def _segment(
        self, base: int, create: bool = False
    ) -> contextlib.AbstractContextManager[int | None]:
        """The segment file's descriptor (from the shared cache, pinned for the block); None
        when the file does not exist and ``create`` is false."""
        return self._files.use(self._segment_path(base), not self.read_only, create)

    @property
    def _index_path(self) -> str:
        return self._paths[0]

    def _recover(self) -> None:
        """Find the end of the complete frames (see the module invariants)."""
        # Start from the last indexed boundary whose bytes are on disk: after a crash the index
        # can name positions whose data never reached the segment file.
        start = self.d.start_position
        for position in self.index.positions_from_end():
            if self._data_end(position) >= position + 32:
                start = position
                break
        start = max(start, self.purged_position)
        end = self._walk(start, None)
        acked = self._read_acked()
        self.has_acked_end = acked is not None
        if acked is not None and self.purged_position <= acked < end:
            # complete frames the writer never acknowledged: a publish refused after some of
            # its blocks were written whose cut failed, or a crash between its blocks
            log.warning(
                "recording %s: cutting %d bytes past its acknowledged end %d",
                self.d.recording_id,
                end - acked,
                acked,
            )
            self.unacknowledged_bytes_cut = end - acked
            self._cut(acked, end)
            end = acked
        if self.stop_position is not None and end >= self.stop_position:
            end = self.stop_position
        self.recorded_position = end
        # the index may name positions at or past the recovered end (a torn tail): drop them,
        # from the file too, so that it stays sorted for readers that search it (read-only opens)
        self.index.cut(end, fsync=True)

    @property
    def _acked_path(self) -> str:
        return self._paths[1]

    def _read_acked(self) -> int | None:
        try:
            data = read_regular(self._acked_path, _ACKED.size)
        except FileNotFoundError:
            return None
        except NotRegularFileError as exc:  # a FIFO opened with open() blocked the start
            log.warning("recording %s: ignoring %s", self.d.recording_id, exc)
            return None
        if not data:  # a spare's, left empty: a crash came before the first acknowledge
            return None
        if len(data) == _ACKED.size:
            position, check = _ACKED.unpack(data)
            if check == ~position:
                return position
        log.warning("recording %s: ignoring a damaged %s", self.d.recording_id, self._acked_path)
        return None

    def acknowledge(self, position: int) -> None:
        """Record ``position`` (the recorded end, after a force when fsync is on) as the end of
        what the writer acknowledged: recovery cuts whatever complete frames lie past it (a
        write that failed and whose cut failed too, or a crash half-way through a write of
        several blocks). The first call creates the file (and syncs the directory)."""
        path = self._paths[1]
        created = not self._acked_written and not os.path.exists(path)
        files = self._files
        entry = files.pin(path, True, True)
        assert entry is not None
        try:
            os.pwrite(entry.fd, _ACKED.pack(position, ~position), 0)
            if self.fsync:
                os.fsync(entry.fd)
        finally:
            files.unpin(entry)
        if created and self.fsync:
            fsync_dir(self.directory)
        self._acked_written = True  # after the directory's fsync: a failed one asks again

    def _data_end(self, position: int) -> int:
        """Where the bytes of ``position``'s segment file end (its written size)."""
        base = self._segment_base(position)
        with self._segment(base) as fd:
            return base if fd is None else base + os.fstat(fd).st_size

    def _walk(self, position: int, limit: int | None) -> int:
        """The end of the run of complete frames from ``position`` (up to ``limit``).

        A frame counts only if its header is sane (positive length, term offset matching its
        position) and it ends within the segment file as written."""
        term_mask = self.d.term_length - 1
        while limit is None or position < limit:
            base = self._segment_base(position)
            with self._segment(base) as fd:
                if fd is None:
                    return position
                size = os.fstat(fd).st_size
                offset = position - base
                want = min(size - offset, 4 * 1024 * 1024)
                if want < 32:
                    return position
                chunk = os.pread(fd, want, offset)
            n = len(chunk)
            i = 0
            while i + 32 <= n:
                length, _v, _f, _t, term_offset = _head_from(chunk, i)
                if length <= 0 or term_offset != (position + i) & term_mask:
                    return position + i
                aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                if offset + i + aligned > size:
                    self.torn_bytes_cut = size - offset - i
                    return position + i
                i += aligned
                if limit is not None and position + i >= limit:
                    return position + i
            if i == 0:
                return position
            position += i
        return position

    def last_message_end(self) -> int:
        """The last message boundary at or below the recorded end: the end itself unless the
        recording ends inside a fragmented message (its BEGIN written, not its END).

        A message never spans terms and is at most ``term_length / 8`` long, so its BEGIN lies
        after the last term start and within two maximum messages of the end: the walk reads
        the frame headers from the last index entry (one append, usually all there is to read),
        and only when no message starts or ends there, from the entry two maximum messages
        back (or the term's start)."""
        end = self.recorded_position
        mask = self.d.term_length - 1
        known = max(self.d.start_position, self.purged_position, end - (end & mask))
        if end <= known:
            return end  # nothing past a known boundary (a term start, the first position)
        last = self.index.floor(end - 1)
        if last is not None and last[1] > known:
            found = self._walk_boundaries(last[1], end, None)
            if found is not None:
                return found
        window = 2 * min(self.d.term_length // 8, 16 * 1024 * 1024) + 2 * self.d.mtu
        far = self.index.floor(end - window)
        if far is not None and far[1] > known:
            found = self._walk_boundaries(far[1], end, None)
        else:
            found = self._walk_boundaries(known, end, known)
        return end if found is None else found

    def _frames(
        self, position: int, end: int, partial: bool = False
    ) -> Iterator[tuple[int, int, int, int]]:
        """The frames from ``position`` (a frame boundary) to ``end``, read from the segment files
        in 4 MiB chunks: ``(position, aligned length, flags, type)`` each. A run of whole-message
        DATA frames of one length comes as its first frame, then (when the walk goes on past it)
        the rest of the run as one item. The walk ends at a frame whose length is not positive,
        at a missing segment, and at a frame that does not end within ``end`` and the bytes
        written, which it yields (as the last item) only when ``partial``."""
        while position < end:
            base = self._segment_base(position)
            with self._segment(base) as fd:
                if fd is None:
                    return
                chunk = os.pread(
                    fd,
                    min(end - position, base + self.d.segment_length - position, 4 << 20),
                    position - base,
                )
            n = len(chunk)
            i = 0
            while i + 32 <= n:
                length, _v, flags, ftype, _o = _head_from(chunk, i)
                if length <= 0:
                    return
                aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                if i + aligned > n:
                    if partial and i == 0:
                        yield position, aligned, flags, ftype
                    break
                yield position + i, aligned, flags, ftype
                if ftype == _DATA and flags & _UNFRAGMENTED == _UNFRAGMENTED:
                    run = uniform_run(chunk, i, length) if n - i >= 16 * aligned else 0
                    if run > 1:
                        yield position + i + aligned, (run - 1) * aligned, flags, ftype
                        i += (run - 1) * aligned
                i += aligned
            if i == 0:
                return
            position += i

    def _walk_boundaries(self, position: int, end: int, boundary: int | None) -> int | None:
        """The last message boundary in ``(position, end]`` (``position``, a frame boundary,
        is one when ``boundary`` says so): after an END fragment or a PAD frame, or where a
        BEGIN fragment starts; None when there is none."""
        for at, aligned, flags, ftype in self._frames(position, end):
            if ftype == _PAD:
                boundary = at + aligned
            elif ftype == _DATA:
                if flags & _END:
                    boundary = at + aligned
                elif flags & _BEGIN:
                    boundary = at
        return boundary

    def next_message_start(self, position: int, limit: int) -> int:
        """The first message boundary at or after ``position`` (a frame boundary), ``limit``
        (one) at most: ``position`` itself when a message begins there, else the end of the
        message it is inside (its END fragment), or of a PAD frame."""
        for at, aligned, flags, ftype in self._frames(position, limit, partial=True):
            if ftype == _DATA and flags & _BEGIN:
                return at
            if ftype == _PAD or flags & _END:
                return min(at + aligned, limit)
        return limit

    def cut_incomplete_message(self) -> int:
        """Cut a fragmented message whose last fragments never came off the recorded end (a
        recording of a publisher that died, or of a server killed, while the message came in);
        the bytes cut. A recording the server framed (publish, sink) never ends inside one."""
        try:
            boundary = self.last_message_end()
        except OSError as exc:
            log.warning(
                "recording %s: cannot look for an incomplete last message: %s",
                self.d.recording_id,
                exc,
            )
            return 0
        cut = self.recorded_position - boundary
        if cut > 0:
            log.warning(
                "recording %s: cutting the %d bytes of an incomplete message at its end %d",
                self.d.recording_id,
                cut,
                self.recorded_position,
            )
            self.rollback(boundary)
        return cut

    def _frame_around(self, start: int, target: int) -> tuple[int, int]:
        """Walk headers from the boundary ``start`` to the frame boundaries around ``target``:
        ``(before, after)`` with ``before <= target < after``, or ``(target, target)``."""
        term_mask = self.d.term_length - 1
        position = start
        while position < target:
            base = self._segment_base(position)
            with self._segment(base) as fd:
                if fd is None:
                    return position, position
                chunk = os.pread(fd, min(target + 32 - position, 8 * 1024 * 1024), position - base)
            i = 0
            n = len(chunk)
            while i + 32 <= n and position + i < target:
                length, _v, _f, _t, term_offset = _head_from(chunk, i)
                if length <= 0 or term_offset != (position + i) & term_mask:
                    return position + i, position + i
                aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                if position + i + aligned > target:
                    return position + i, position + i + aligned
                i += aligned
            if i == 0:
                return position, position
            position += i
        return target, target

    # --- writing ------------------------------------------------------------------------------

    def append(
        self, block: bytes | bytearray | memoryview | Gathered, position: int, now_ns: int
    ) -> None:
        """Write ``block`` at ``position`` (the recorded end) and index it. A
        :class:`~aeron_spark.transport.archive.diskio.Gathered` block (a large message's
        payload beside its frame headers) is written with ``os.pwritev``, still one append.

        All or nothing: a short ``pwrite`` is continued where it stopped; a write that fails
        (ENOSPC, EIO, EMFILE, ...) or makes no progress raises ``OSError`` after the bytes and
        index entry of this call are cut off again, so ``recorded_position`` never moves past
        what is in the files and the next append starts at the same position."""
        if position != self.recorded_position:
            raise PositionOutOfRangeError(
                f"recording {self.d.recording_id}: append at {position}, expected "
                f"{self.recorded_position}",
                position=position,
            )
        if isinstance(block, Gathered):
            size = len(block)
            try:
                self._write_gathered(block, position)
                self._indexed(position, now_ns)
            except BaseException:
                self.failed_appends += 1
                self._cut(position, position + size)
                raise
            self.recorded_position = position + size
            return
        view = memoryview(block)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        size = len(view)
        written = 0
        files = self._files
        segment_length = self.d.segment_length
        try:
            while written < size:
                pos = position + written
                base = pos - pos % segment_length  # _segment_base, inline (a call a publish)
                piece = view[written : written + base + segment_length - pos]
                path = self._segment_path(base)
                if base not in self._present:
                    if not os.path.exists(path):
                        self._dir_dirty = True  # its name is fsynced with the data (force)
                    self._present.add(base)
                # pinned without a context manager: a publish's three writes spent more time
                # in their wrappers than in the system calls (issue 31)
                entry = files.pin(path, True, True)
                assert entry is not None
                try:
                    self._dirty.add(base)
                    count = os.pwrite(entry.fd, piece, pos - base)
                    if count != len(piece):  # as _pwrite_all: no progress raises, short goes on
                        if count <= 0:
                            raise OSError(errno.ENOSPC, "write made no progress", path)
                        rest, at = piece[count:], pos + count - base
                        self.short_writes += 1 - _pwrite_all(entry.fd, rest, at, path)
                finally:
                    files.unpin(entry)
                written += len(piece)
            self._indexed(position, now_ns)
        except BaseException:
            self.failed_appends += 1
            self._cut(position, position + size)
            raise
        self.recorded_position = position + size

    def _indexed(self, position: int, now_ns: int) -> None:
        """After an append's bytes are written: forced (fsync on) and its index entry added."""
        if self.fsync:
            self._force_segments()
        last = self.index.last
        if last is None:
            self._add_index(position, now_ns, True)
            return
        if now_ns < last[1]:
            now_ns = last[1]  # the wall clock stepped back: keep it sorted
        if position - last[0] >= INDEX_INTERVAL_BYTES or now_ns - last[1] >= INDEX_INTERVAL_NS:
            self._add_index(position, now_ns, False)

    def _write_gathered(self, block: Gathered, position: int) -> None:
        """Write a gathered block's parts in order from ``position``: ``os.pwritev`` calls of
        at most ``IOV_MAX`` buffers, none crossing a segment file's end (a part that does is
        cut there), short writes continued. Raises ``OSError`` as ``append`` says."""
        segment_length = self.d.segment_length
        pos = position
        batch: list[memoryview] = []
        batch_at = pos

        def flush() -> None:
            nonlocal batch, batch_at
            if batch:
                base = self._segment_base(batch_at)
                with self._segment(base, create=True) as fd:
                    assert fd is not None
                    self._dirty.add(base)
                    count = pwritev_all(fd, batch, batch_at - base, self._segment_path(base))
                if count < 0:  # short writes happened, all were continued
                    self.short_writes += -count
            batch = []
            batch_at = pos

        for part in block.parts:
            view = memoryview(part)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            while len(view):
                room = self._segment_base(pos) + segment_length - pos
                piece = view[:room] if len(view) > room else view
                batch.append(piece)
                pos += len(piece)
                view = view[len(piece) :]
                if len(batch) == IOV_MAX or pos == self._segment_base(batch_at) + segment_length:
                    flush()
        flush()
        if pos != position + len(block):
            raise ValueError(f"a gathered block of {len(block)} bytes held {pos - position}")

    def _add_index(self, position: int, now_ns: int, first: bool) -> None:
        # the index file holds exactly the entries counted (recovery cuts anything else), so
        # the next one goes at their end; a failed write is cut off by the caller (``first``:
        # the index holds no entry yet)
        self._index_dirty = True
        path = self._paths[0]
        if first and not self._index_present and not os.path.exists(path):
            self._dir_dirty = True  # the index file is new: its name is fsynced by force()
        self._index_present = True  # (a spare's exists: no stat on the first publish)
        files = self._files
        entry = files.pin(path, True, True)
        assert entry is not None
        try:
            self.index.append(position, now_ns, entry.fd)
        finally:
            files.unpin(entry)

    def rollback(self, position: int) -> None:
        """Forget what was appended from ``position`` (a boundary this writer appended at, not
        below what readers were told is recorded) on: a publish or commit that failed half-way
        takes back its first blocks, so nothing of it stays on disk or in the index."""
        if not self.d.start_position <= position <= self.recorded_position:
            raise PositionOutOfRangeError(
                f"recording {self.d.recording_id}: rollback to {position} is outside "
                f"[{self.d.start_position}, {self.recorded_position}]",
                position=position,
            )
        end = self.recorded_position
        self.recorded_position = position
        self._cut(position, end)

    def _cut(self, position: int, end: int) -> None:
        """Truncate segment and index files back to ``position`` (bytes up to ``end`` may have
        been written). Needs no descriptor (``truncate``/``unlink`` by path), so it works after
        EMFILE too. Should it still fail, the bytes past ``position`` are overwritten by the next
        append, and until then only a crash would show them (recovery walks complete frames)."""
        try:
            self.index.cut(position)
            first = self._segment_base(position)
            last = self._segment_base(max(end - 1, position))
            for base in range(last, first, -self.d.segment_length):
                path = self._segment_path(base)
                self._files.forget(path)
                self._dirty.discard(base)
                self._present.discard(base)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            with contextlib.suppress(FileNotFoundError):
                if os.path.getsize(self._segment_path(first)) > position - first:
                    os.truncate(self._segment_path(first), position - first)
        except OSError as exc:
            self.cut_failures += 1
            log.warning(
                "recording %s: cannot cut back to %s: %s", self.d.recording_id, position, exc
            )

    def _force_segments(self) -> None:
        for base in sorted(self._dirty):
            with self._segment(base) as fd:
                if fd is not None:
                    os.fsync(fd)
        self._dirty.clear()
        if self._dir_dirty:  # a new segment file's name (before, only its data was fsynced)
            fsync_dir(self.directory)
            self._dir_dirty = False

    def force(self) -> None:
        """fsync what was appended since the last force (segments and index)."""
        self._force_segments()
        if self._index_dirty:
            with self._files.use(self._index_path, True) as fd:
                if fd is not None:
                    os.fsync(fd)
            self._index_dirty = False
        if self._dir_dirty:
            fsync_dir(self.directory)
            self._dir_dirty = False

    def stop(self, now_ns: int) -> None:
        """Finish the recording at its recorded end and close its files.

        Never raises for a full or failing disk: the stop position holds in memory at once
        (the end is final either way) and ``stop.msgpack`` is written by :meth:`persist_stop`
        later (the store retries); a crash before that is recovered to the same end, since
        recovery stops a recording where its complete frames end and appends never leave bytes
        past the recorded end."""
        if self.stop_position is None:
            self.stop_position = self.recorded_position
            self._stop_ns = now_ns
            self.stop_pending = True
            if not self.persist_stop() and self._stops_pending is not None:
                self._stops_pending[self.d.recording_id] = self
        self._files.forget_under(self.directory)

    def persist_stop(self) -> bool:
        """Write ``stop.msgpack`` if :meth:`stop` could not; True once it is on disk."""
        if not self.stop_pending:
            return True
        try:
            self.force()
            _write_meta(
                os.path.join(self.directory, "stop.msgpack"),
                {"stop_position": self.stop_position, "stop_timestamp_ns": self._stop_ns},
            )
        except OSError as exc:
            log.warning(
                "recording %s: cannot write its stop position yet: %s", self.d.recording_id, exc
            )
            return False
        finally:
            self._files.forget_under(self.directory)
        self.stop_pending = False
        if self._stops_pending is not None:
            self._stops_pending.pop(self.d.recording_id, None)
        return True

    def reopen(self) -> None:
        """Extend a stopped recording (sink recordings after a restart)."""
        if self.stop_position is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, "stop.msgpack"))
            fsync_dir(self.directory)
            self.stop_position = None
            self.stop_pending = False
            if self._stops_pending is not None:
                self._stops_pending.pop(self.d.recording_id, None)

    # --- reading ------------------------------------------------------------------------------

    def check_position(self, position: int, limit: int, what: str) -> None:
        """Raise the typed error unless ``position`` is a readable frame boundary <= limit."""
        rid = self.d.recording_id
        if position < self.purged_position and position >= self.d.start_position:
            raise PurgedError(
                f"recording {rid}: {what} {position} was purged (first readable position is "
                f"{self.purged_position})",
                position=position,
                purged_position=self.purged_position,
            )
        if not self.d.start_position <= position <= limit:
            raise PositionOutOfRangeError(
                f"recording {rid}: {what} {position} is outside [{self.d.start_position}, {limit}]",
                position=position,
                start_position=self.d.start_position,
                end_position=limit,
            )
        if position == limit or position in (self.d.start_position, self.purged_position):
            return
        found = self.index.floor(position)
        boundary = self.d.start_position if found is None else found[1]
        if boundary < self.purged_position:
            boundary = self.purged_position
        before, after = self._frame_around(boundary, position)
        if before != position:
            raise NotFrameBoundaryError(
                f"recording {rid}: {what} {position} is inside a frame; the nearest frame "
                f"boundaries are {before} and {after}",
                position=position,
                before=before,
                after=after,
            )

    def read(self, position: int, max_bytes: int, limit: int) -> tuple[int, bytes, int]:
        """Whole frames from ``position`` (a boundary) within one term and before the next
        indexed boundary, ending at most at ``limit``: returns ``(end_position, frames without
        PAD, timestamp_ns)``. The end is past a trailing PAD frame; the frames may be empty when
        only a PAD was read."""
        if position < self.purged_position:
            raise PurgedError(
                f"recording {self.d.recording_id}: position {position} was purged",
                position=position,
                purged_position=self.purged_position,
            )
        term_end = (position | (self.d.term_length - 1)) + 1
        end = min(limit, term_end, position + max_bytes)
        # End before the next indexed boundary: every message of a block then has the block's
        # time (time_at of its own position), however a replay cuts its blocks.
        following = self.index.next_position(position)
        if following is not None and following < end:
            end = following
        base = self._segment_base(position)
        with self._segment(base) as fd:
            if fd is None:
                raise PurgedError(
                    f"recording {self.d.recording_id}: segment of {position} is gone",
                    position=position,
                    purged_position=self.purged_position,
                )
            chunk = os.pread(fd, end - position, position - base)
            got = _whole_frames(chunk, position, limit)
            if got is None:
                # a single frame larger than max_bytes: read exactly that frame, once (when the
                # file holds less than the frame, nothing is returned: the caller says so)
                length = _head_from(chunk, 0)[0] if len(chunk) >= 32 else 0
                aligned = (length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
                if length > 0 and len(chunk) < aligned and position + aligned <= limit:
                    chunk = os.pread(fd, aligned, position - base)
                    got = _whole_frames(chunk, position, limit)
        end_position, frames = got if got is not None else (position, b"")
        return end_position, frames, self.time_at(position)

    def time_at(self, position: int) -> int:
        """The record time of the message at ``position``: the time indexed at or below it."""
        ts = self.index.time_at(position)
        return self.d.start_timestamp_ns if ts is None else ts

    def position_at(self, timestamp_ns: int) -> int:
        """The first indexed boundary recorded at or after ``timestamp_ns`` (the recorded end
        when none is)."""
        found = self.index.first_at_or_after(timestamp_ns, self.purged_position)
        return self.recorded_position if found is None else found

    def purge(self, position: int) -> int:
        """Make ``position`` (a boundary) the first readable one; delete whole segments below."""
        if position <= self.purged_position:
            return self.purged_position
        self.check_position(position, self.recorded_position, "purge position")
        _write_meta(os.path.join(self.directory, "purged.msgpack"), {"purged_position": position})
        self.purged_position = position
        base = self._segment_base(position)
        for name in os.listdir(self.directory):
            if name.endswith(".seg") and int(name[:-4]) < base:
                path = os.path.join(self.directory, name)
                self._files.forget(path)
                os.unlink(path)
        return position

    def close(self) -> None:
        """Close this recording's descriptors (it can still be used: they reopen on demand)."""
        if self._own_files:
            self._files.close()
        else:
            self._files.forget_under(self.directory)


class RecordingStore:
    """All recordings under ``<directory>/recordings``."""

    def __init__(
        self,
        directory: str,
        fsync: bool,
        max_open_files: int = 64,
        spare_open_files: int | None = None,
    ) -> None:
        """``spare_open_files``: descriptors the spares may hold open (None: ``max_open_files``)."""
        self.root = os.path.join(directory, "recordings")
        os.makedirs(self.root, exist_ok=True)
        self.fsync = fsync
        # every recording's segment and index descriptors: at most max_open_files besides those
        # in use this instant, whatever the number of recordings
        self.files = FdCache(max_open_files)
        self.recordings: dict[int, Recording] = {}
        self._stops_pending: dict[int, Recording] = {}  # stopped, stop file not yet written
        self.stop_retries = 0  # stop files tried again by persist_stops
        self.torn_bytes_cut = 0
        self.unacknowledged_bytes_cut = 0
        self.incomplete_tail_bytes_cut = 0  # incomplete last messages of recovered recordings
        # directories with files but no readable descriptor (lost or damaged): left as they are,
        # and their ids never given to a new recording (whose creation would recover the files
        # into it: another stream's data at the start of a new recording)
        self.orphan_directories: list[str] = []
        self.empty_leftovers_removed = 0  # no descriptor, nothing recorded: removed at start
        # not directories but named like one (an operator's note, a copy gone wrong): skipped,
        # named in a warning, left as they are, and their ids never issued (a recording made
        # there would meet the file); before, one made the server unstartable
        self.stray_files: list[str] = []
        orphan_max = -1
        for name in sorted(os.listdir(self.root)):
            if not (name.isascii() and name.isdigit()):  # int("²") fails: not a recording
                continue
            path = os.path.join(self.root, name)
            if not os.path.isdir(path):
                orphan_max = max(orphan_max, int(name))
                self.stray_files.append(path)
                continue
            meta = _read_descriptor(path)
            if meta is None:  # died between mkdir and its descriptor (empty), lost or damaged
                orphan_max = max(orphan_max, int(name))  # its id is never issued again
                if _nothing_recorded(path):
                    # a crash before the descriptor of a directory made or a spare renamed in
                    # (its files empty): before, a spare's empty files made it an orphan "with
                    # data", warned about and left for good
                    shutil.rmtree(path, ignore_errors=True)
                    self.empty_leftovers_removed += 1
                else:
                    self.orphan_directories.append(path)
                continue
            rec = Recording(path, meta, fsync, fds=self.files, stops_pending=self._stops_pending)
            self.torn_bytes_cut += rec.torn_bytes_cut
            self.unacknowledged_bytes_cut += rec.unacknowledged_bytes_cut
            if rec.stop_position is None and not rec.d.source.startswith("sink:"):
                # recovered after a crash: finished where its last whole message ends (a
                # recorded image's last message may have been coming in; a recording with an
                # acknowledged end was cut to it: a publish's, whole messages only)
                if not rec.has_acked_end:
                    self.incomplete_tail_bytes_cut += rec.cut_incomplete_message()
                rec.stop(0)
            self.recordings[rec.d.recording_id] = rec
        self._id_mark_path = os.path.join(self.root, ID_MARK_FILE)
        mark = self._read_id_mark()
        self._next_id = max(max(self.recordings, default=-1), orphan_max, mark - 1) + 1
        self._ids_reserved = mark  # ids below it are durably issued (the mark is on disk)
        # the first block now, at open: the caller's thread (the server's loop) fsyncs the mark
        # only once every ID_BLOCK recordings after that
        try:
            self._reserve_ids(self._next_id + ID_BLOCK)
        except OSError as exc:  # a full disk: the first create tries again (and fails alike)
            log.warning("cannot write the recording id mark %s: %s", self._id_mark_path, exc)
        if self.orphan_directories:
            log.warning(
                "recording directories with data but no readable descriptor (meta.msgpack), "
                "not served and their ids not reused: %s",
                ", ".join(self.orphan_directories),
            )
        if self.stray_files:
            log.warning(
                "files named like recordings in %s, not directories: skipped, left as they are "
                "and their ids not issued: %s",
                self.root,
                ", ".join(self.stray_files),
            )
        self._lock = threading.Lock()
        self._mark_lock = threading.Lock()  # one writer of the id mark at a time
        self._mark_failed = False  # the spares' thread could not advance it (logged once)
        # empty recording directories made ahead on a thread of their own, their files held
        # open (up to as many descriptors as the file cache holds): a creation writes its
        # descriptor into one and renames it into place instead of making five names and
        # opening four files on the caller's thread (issue 31 item 1); the same thread
        # advances the id mark ahead of the ids the spares wanted will take
        spare_budget = max_open_files if spare_open_files is None else spare_open_files
        self.spares = SparePool(
            self.root, fsync, open_budget=spare_budget, chore=self._reserve_ahead
        )
        # without fsync: new recordings' descriptors are fsynced off the caller's thread
        self.meta_syncer = MetaSyncer()

    def _read_id_mark(self) -> int:
        """The durable high-water mark of issued ids (0 without one: a new store, or one made
        before the mark existed, whose directories are then all there is to go by)."""
        try:
            body = _read_meta(self._id_mark_path)
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            body = {"next_id": exc}
        if body is None:
            return 0
        mark = body.get("next_id") if isinstance(body, dict) else None
        if not isinstance(mark, int) or isinstance(mark, bool) or not 0 <= mark <= ID_MARK_MAX:
            # written whole and renamed in, so only a damaged disk gets here: starting without it
            # could issue ids again; the operator decides (a value past every id ever issued)
            value = body.get("next_id") if isinstance(body, dict) else body
            why = (
                f"{type(value).__name__}: {value}"
                if isinstance(value, BaseException)
                else f"next_id {value!r:.80}"
            )
            raise IdMarkCorruptError(
                f"recording id mark {self._id_mark_path} is unreadable (ID_MARK_CORRUPT: "
                f"{why}): write {{'next_id': N}} there (msgpack), N past every recording id "
                "ever issued",
                path=str(self._id_mark_path),
            )
        return mark

    def _reserve_ids(self, mark: int) -> None:
        """Make ``mark`` the durable high-water mark (called under the mark's lock, before an
        id at or past the previous mark is used; an error leaves the mark and issues
        nothing). A mark below the one reserved is not written."""
        if mark <= self._ids_reserved:
            return
        try:
            _write_meta(self._id_mark_path, {"next_id": mark}, sync=True)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self._id_mark_path + ".tmp")
            raise
        self._ids_reserved = mark

    def issue_past(self, recording_id: int) -> None:
        """Never issue ``recording_id`` or an id below it: ids the server's other state names
        (consumer positions, the sink commit log), which outlive ``recordings/`` deleted whole,
        mark included (before, the next recording took such an id and a consumer's committed
        position applied to it). The mark is written past it now when it is behind, so the ids
        stay issued once the positions that named them are dropped (their recordings gone) and
        the server restarts before its next creation; a full disk leaves that to the next
        creation. An id no store reaches (``ID_MARK_MAX`` or more: a damaged file) is logged and
        not followed."""
        if recording_id >= ID_MARK_MAX:
            log.warning("recording id %d named elsewhere is past any issued: ignored", recording_id)
            return
        with self._lock:
            self._next_id = max(self._next_id, recording_id + 1)
            next_id = self._next_id
        try:
            with self._mark_lock:
                self._reserve_ids(next_id)
        except OSError as exc:  # a full disk: the next creation writes it, or fails alike
            log.warning("cannot write the recording id mark %s: %s", self._id_mark_path, exc)

    def _reserve_ahead(self) -> None:
        """(The spares' thread) Keep the durable mark at least half a block past the ids the
        wanted spares will take, so a burst of creations (2,048 sessions publishing a first
        time in one second) never writes and fsyncs it on the caller's thread: before, the
        loop did so every ``ID_BLOCK`` creations, two fsyncs each time."""
        ahead = self.spares.wanted
        if self._ids_reserved >= self._next_id + ahead + ID_BLOCK // 2:
            return
        try:
            with self._mark_lock:
                if self._ids_reserved < self._next_id + ahead + ID_BLOCK // 2:
                    self._reserve_ids(self._next_id + ahead + ID_BLOCK)
        except OSError as exc:  # a full disk: the caller's thread tries when it must
            if not self._mark_failed:
                log.warning("cannot advance the recording id mark %s: %s", self._id_mark_path, exc)
            self._mark_failed = True

    def get(self, recording_id: int) -> Recording:
        rec = self.recordings.get(recording_id)
        if rec is None:
            raise UnknownRecordingError(f"no recording {recording_id}", recording_id=recording_id)
        return rec

    def create(
        self,
        stream_id: int,
        session_id: int,
        source: str,
        initial_term_id: int,
        term_id: int,
        term_offset: int,
        term_length: int,
        mtu: int,
        now_ns: int,
    ) -> Recording:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
        if rid >= self._ids_reserved:  # the spares' thread did not keep ahead (or none runs)
            try:
                with self._mark_lock:
                    if rid >= self._ids_reserved:
                        self._reserve_ids(rid + ID_BLOCK)  # an OSError (full disk) issues nothing
            except BaseException:
                with self._lock:
                    if self._next_id == rid + 1:
                        self._next_id = rid
                raise
        elif self._ids_reserved - rid <= ID_BLOCK // 2:
            self.spares.poke()  # the mark advanced ahead, off this thread
        shift = term_length.bit_length() - 1
        start = compute_position(term_id, term_offset, shift, initial_term_id)
        descriptor = Descriptor(
            rid,
            stream_id,
            session_id,
            source,
            start,
            now_ns,
            initial_term_id,
            term_length,
            mtu,
            max(term_length, 64 * 1024 * 1024),
        )
        path = os.path.join(self.root, str(rid))
        meta = os.path.join(path, "meta.msgpack")
        fresh = True
        # a spare holds the segment file of position 0: only for recordings starting in it
        spare = self.spares.take() if start < descriptor.segment_length else None
        if spare is not None:
            try:
                used = self._from_spare(spare, path, descriptor)
            except BaseException:
                self._undo_create(rid, path, meta)
                raise
            if not used:
                spare = None
        if spare is None:
            try:
                try:
                    os.mkdir(path)
                except FileExistsError:
                    fresh = False  # a leftover directory: what it holds is recovered, as before
                except FileNotFoundError:
                    os.makedirs(path, exist_ok=True)
                _write_meta(meta, descriptor.__dict__, sync=self.fsync)
                if self.fsync:  # the new directory's name too: before, a power cut could lose it
                    fsync_dir(self.root)
            except BaseException:
                # a full disk (or no descriptor): take back what was made and the id, so a
                # caller that retries (an ingest image waiting for room, every 100 ms) leaves
                # nothing behind; before, each try left a directory with a meta.msgpack.tmp
                self._undo_create(rid, path, meta)
                raise
        if not self.fsync:
            self.meta_syncer.submit(meta)
        rec = Recording(
            path,
            descriptor,
            self.fsync,
            fds=self.files,
            stops_pending=self._stops_pending,
            fresh=fresh,
            spare=spare is not None,
        )
        self.recordings[rid] = rec
        return rec

    def _from_spare(self, spare: Spare, path: str, descriptor: Descriptor) -> bool:
        """Make the recording at ``path`` from ``spare``: its descriptor written into the
        spare's ``meta.msgpack`` (one ``pwrite`` when the spare's files are open; fsynced with
        ``fsync``), the spare renamed to ``path`` (the recording appears with its descriptor
        whole), its open files handed to the file cache. False when the rename failed (the
        caller makes the directory itself, as without a spare); raises when the descriptor
        cannot be written (the spare is given back as it was, or dropped)."""
        fds = spare.fds
        meta_fd = fds.get(SPARE_META)
        own_fd = meta_fd is None
        body = msgpack.packb(descriptor.__dict__)
        meta_path = os.path.join(spare.path, SPARE_META)
        try:
            if meta_fd is None:
                meta_fd = os.open(meta_path, os.O_WRONLY)
            try:
                _pwrite_all(meta_fd, body, 0, meta_path)
                if self.fsync:  # the name is durable already (the spare's thread fsynced it)
                    os.fsync(meta_fd)
                os.rename(spare.path, path)  # over nothing, or a leftover empty directory
            except BaseException as exc:
                try:
                    os.ftruncate(meta_fd, 0)  # empty again: the spare is whole
                except OSError:
                    self._drop_spare(spare)
                else:
                    if os.path.isdir(spare.path):  # a leftover with files at ``path``
                        self.spares.give_back(spare)
                    else:  # deleted under the store: given back, every creation took it
                        self._drop_spare(spare)
                if isinstance(exc, OSError) and exc.filename == spare.path:
                    return False  # the rename: the caller makes the directory
                raise
        finally:
            if own_fd and meta_fd is not None:
                os.close(meta_fd)
        if fds:
            data = dict(fds)
            self.spares.retire(data.pop(SPARE_META))  # closed on the spares' thread
            self.files.adopt(path, data)
            spare.fds = {}
        if self.fsync:  # the new directory's name too: before, a power cut could lose it
            try:
                fsync_dir(self.root)
            except BaseException:  # its empty files go with it (the caller removes the rest)
                self.files.forget_under(path)
                for name in SPARE_FILES:
                    if name != SPARE_META:
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join(path, name))
                raise
        return True

    def _drop_spare(self, spare: Spare) -> None:
        for fd in spare.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        spare.fds = {}
        shutil.rmtree(spare.path, ignore_errors=True)

    def _undo_create(self, rid: int, path: str, meta: str) -> None:
        for leftover in (meta, meta + ".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        with contextlib.suppress(OSError):
            os.rmdir(path)  # only when empty: a stale recording's files are never removed here
        with self._lock:
            if self._next_id == rid + 1:
                self._next_id = rid

    def persist_stops(self) -> int:
        """Write the stop files a full disk held back (see :meth:`Recording.stop`); how many
        are still missing. Only those recordings are tried (the server calls this every
        second: it walked all 10,000 of a large catalog, issue 31 item 4)."""
        pending = list(self._stops_pending.values())
        self.stop_retries += len(pending)
        return sum(not rec.persist_stop() for rec in pending)

    def stats(self) -> dict[str, int]:
        recs = list(self.recordings.values())
        return {
            **self.files.stats(),
            "short_writes": sum(r.short_writes for r in recs),
            "failed_appends": sum(r.failed_appends for r in recs),
            "cut_failures": sum(r.cut_failures for r in recs),
            "stops_pending": sum(r.stop_pending for r in recs),
            **self.spares.stats(),
        }

    def close(self, now_ns: int) -> None:
        for rec in self.recordings.values():
            if rec.stop_position is None and not rec.d.source.startswith("sink:"):
                rec.stop(now_ns)
            rec.persist_stop()
            rec.close()
        self.files.close()
        self.meta_syncer.close()
        self.spares.close()


__all__ = ["Descriptor", "Recording", "RecordingStore"]

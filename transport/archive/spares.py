"""Empty recording directories made ahead of need, off the caller's thread (issue 31 item 1).

Creating a recording makes five names (its directory, the descriptor's temporary file, the
``acked``, ``index`` and first segment files); on the project's machine each costs 160-260 µs of
CPU in the file system, about 1.2 ms a recording, and a stream server creates one on the loop
that serves every session when a session first publishes to a stream: 2,048 sessions starting to
publish at once stalled it for seconds. A :class:`SparePool` keeps up to a wanted number of
*spares* ready: ``<root>/spare-<n>/`` holding those four files, empty, made by a thread of its
own while the server has time (its sessions open one by one). :meth:`RecordingStore.create
<.recordings.RecordingStore.create>` renames one into place as ``<root>/<id>/`` (one rename) and
writes the descriptor into its temporary file before renaming that in, as before.

Nothing in a spare is data: the store never lists it as a recording (names that are not digits
are skipped, by older versions too); at start the spares left by the last run are kept when they
hold exactly those four empty files and removed otherwise (a spare a crash left half made).
Spares past the wanted number (made for a peak of sessions that went, or adopted at start)
are trimmed by the same thread once they have been in excess for ``trim_after_s`` (60 s: a
wave of sessions closing and opening again reuses them, none made twice); before, a peak's
spares stayed on disk for good.
With ``fsync`` a spare's names are fsynced (its directory) before it is handed out, and the
store fsyncs the recordings directory after the rename, as after a ``mkdir``.

A spare also holds its four files *open* (the thread opened them when it made them), up to
``open_budget`` descriptors in all: the store writes the descriptor into the spare's
``meta.msgpack`` with one ``pwrite``, renames the spare in (the recording appears with its
descriptor whole: one rename, no temporary file), hands the three data files' descriptors to
its file cache and the descriptor's to this thread to close. Renaming a directory leaves its
open files open. A first publish then opens no file and makes no name on the caller's thread
(issue 31: every system call there let the driver's thread take the GIL, and 2,048 first
publishes in one second cost ~1.2 ms each on the loop, most of it waiting). A spare the budget
left without open files is opened by the thread as soon as a taken one frees its share; one
taken bare is opened by the caller, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

PREFIX = "spare-"
#: The files a spare holds, all empty: the descriptor (written just before the spare is renamed
#: in: a spare holding anything is not whole), the acknowledged end, the time index and the
#: segment of position 0 (a recording that starts elsewhere takes none).
SEGMENT_0 = f"{0:020d}.seg"
META = "meta.msgpack"
FILES = (META, "acked", "index", SEGMENT_0)
#: What older versions' spares held instead of ``META`` (a temporary file renamed in later).
OLD_META = "meta.msgpack.tmp"
#: Descriptors retired (:meth:`SparePool.retire`) before the thread wakes to close them.
RETIRE_BATCH = 32


class Spare:
    """A ready spare: its path, and its files' descriptors by name (empty: none open)."""

    __slots__ = ("fds", "path")

    def __init__(self, path: str, fds: dict[str, int] | None = None) -> None:
        self.path = path
        self.fds: dict[str, int] = fds or {}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SparePool:
    """Spares under ``root`` (see the module docstring); at most ``capacity`` wanted at once,
    holding at most ``open_budget`` open descriptors in all. ``chore``: called on the thread
    before it makes spares, each time it wakes (the store reserves recording ids ahead there)."""

    def __init__(
        self,
        root: str,
        fsync: bool,
        capacity: int = 4096,
        open_budget: int = 0,
        chore: Callable[[], None] | None = None,
        trim_after_s: float = 60.0,
    ) -> None:
        self.root = root
        self.fsync = fsync
        self.capacity = capacity
        self.open_limit = max(0, open_budget) // len(FILES)  # spares holding open files
        self._chore = chore
        self.trim_after_s = trim_after_s  # spares in excess this long are removed
        self._excess_since: float | None = None  # monotonic s: more ready than wanted since
        self.trimmed = 0  # spares removed: in excess of what the open sessions need
        self._poke = False  # the chore asked for (poke)
        self._open_failed = False  # opening a ready spare's files failed: no more tries
        self._ready: deque[Spare] = deque()
        self._holding = 0  # ready spares holding open files
        self._retired: list[int] = []  # descriptors the store is done with: closed here
        self._wanted = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.made = 0  # spares made by this process
        self.taken = 0  # spares renamed into recordings
        self.taken_open = 0  # of those, taken with their files open
        self.failures = 0  # spares that could not be made (full disk, no descriptor): counted
        self.removed = 0  # leftovers of a previous run removed at start (half made)
        self._next = self._adopt()
        if self._ready:  # adopted: trimmed unless sessions come to want them
            self._note_excess()

    def _adopt(self) -> int:
        """Keep the previous run's whole spares, remove the rest; the next spare's number."""
        last = -1
        for name in sorted(os.listdir(self.root)):
            if not name.startswith(PREFIX):
                continue
            path = os.path.join(self.root, name)
            suffix = name[len(PREFIX) :]
            if suffix.isdigit():
                last = max(last, int(suffix))
            if suffix.isdigit() and self._is_whole(path):
                if self.fsync:  # made by a run without --fsync: its names made durable now
                    try:
                        _fsync_dir(path)
                    except OSError:
                        shutil.rmtree(path, ignore_errors=True)
                        self.removed += 1
                        continue
                self._ready.append(Spare(path))  # its files opened by the thread
            else:
                if os.path.islink(path) or not os.path.isdir(path):  # rmtree refuses a link
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)
                self.removed += 1
        return last + 1

    @staticmethod
    def _is_whole(path: str) -> bool:
        """Exactly the spare's names, each an empty regular file of one name (``lstat``: a
        symlink to an empty file elsewhere looked whole, and a recording made from it wrote its
        messages through the link; a FIFO failed every append; a hard link, another name of the
        file elsewhere, had the messages written there too). A spare a crash caught with its
        descriptor written (about to be renamed in) is not whole."""
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
            names = os.listdir(path)
            if sorted(names) != sorted(FILES):
                return False
            for name in names:
                st = os.lstat(os.path.join(path, name))
                if not stat.S_ISREG(st.st_mode) or st.st_size != 0 or st.st_nlink != 1:
                    return False
            return True
        except OSError:
            return False

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def wanted(self) -> int:
        return self._wanted

    @property
    def open_files(self) -> int:
        """Descriptors the ready spares hold (at most the budget)."""
        return self._holding * len(FILES)

    def _note_excess(self) -> None:
        """(Under the lock.) Mark when the ready spares first exceeded the wanted number."""
        if len(self._ready) > self._wanted:
            if self._excess_since is None:
                self._excess_since = time.monotonic()
        else:
            self._excess_since = None

    def _trim_due(self) -> bool:
        """(Under the lock.) Spares have been in excess for ``trim_after_s``."""
        since = self._excess_since
        return since is not None and time.monotonic() >= since + self.trim_after_s

    def want(self, count: int) -> None:
        """Keep ``count`` spares ready (at most ``capacity``): the thread makes the missing ones
        and trims the ones in excess for ``trim_after_s``."""
        with self._cond:
            self._wanted = max(0, min(count, self.capacity))
            self._note_excess()
            # an excess beginning: the thread's wait takes its trim deadline
            if self._closed or not (self._work() or self._excess_since is not None):
                return
            self._start()
            self._cond.notify()

    def poke(self) -> None:
        """Wake the thread for its chore (started if need be)."""
        with self._cond:
            if self._closed:
                return
            self._poke = True
            self._start()
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="aeron-spark-spares", daemon=True
            )
            self._thread.start()

    def take(self) -> Spare | None:
        """A ready spare (the caller renames it away; its open files are the caller's), or
        None."""
        with self._cond:
            if not self._ready:
                return None
            spare = self._ready.popleft()
            self.taken += 1
            if spare.fds:
                self._holding -= 1
                self.taken_open += 1
            self._note_excess()
            if self._work():
                self._cond.notify()
            return spare

    def give_back(self, spare: Spare) -> None:
        """A spare taken but not used (its rename failed), as it was taken: ready again."""
        with self._cond:
            self._ready.appendleft(spare)
            self.taken -= 1
            if spare.fds:
                self._holding += 1
                self.taken_open -= 1
            self._note_excess()
            if self._excess_since is not None and self._thread is not None:
                self._cond.notify()  # its wait takes the trim deadline

    def retire(self, fd: int) -> None:
        """A descriptor the caller is done with: closed by the thread, ``RETIRE_BATCH`` at a
        time (a ``close`` less on the caller's, and no wake-up of the thread for each)."""
        with self._cond:
            if self._closed:
                with contextlib.suppress(OSError):
                    os.close(fd)
                return
            self._retired.append(fd)
            if len(self._retired) >= RETIRE_BATCH:
                self._start()
                self._cond.notify()

    def _close_retired(self) -> None:
        retired, self._retired = self._retired, []
        for fd in retired:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _work(self) -> bool:
        """(Under the lock) whether the thread has something to do."""
        if self._poke or len(self._retired) >= RETIRE_BATCH or len(self._ready) < self._wanted:
            return True
        return self._may_open() or self._trim_due()

    def _may_open(self) -> bool:
        """A ready spare without open files that the budget lets the thread open."""
        return (
            not self._open_failed
            and self._holding < self.open_limit
            and len(self._ready) > self._holding
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._work():
                    since = self._excess_since  # a trim due later: woken for it
                    self._cond.wait(
                        None
                        if since is None
                        else max(since + self.trim_after_s - time.monotonic(), 0.001)
                    )
                if self._closed:
                    return
                self._poke = False
                trim = None
                retired, self._retired = self._retired, []
                make = len(self._ready) < self._wanted
                if not make and self._trim_due():
                    trim = self._ready.pop()  # the newest: takes go oldest first
                    if trim.fds:
                        self._holding -= 1
                    self._note_excess()
                # only this thread adds to ``_holding`` (a take subtracts): the budget checked
                # here holds when the files are open
                keep_open = self._holding < self.open_limit
                bare = None
                if make:
                    path = os.path.join(self.root, f"{PREFIX}{self._next}")
                    self._next += 1
                elif trim is None and self._may_open():
                    # a ready spare without open files (adopted at start, or made over the
                    # budget): taken out while its files are opened, so no one renames it
                    bare = next((sp for sp in reversed(self._ready) if not sp.fds), None)
                    if bare is not None:
                        self._ready.remove(bare)
                    else:  # the counts disagree (never expected): no spinning on them
                        self._open_failed = True
            for fd in retired:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if self._chore is not None:
                self._chore()
            if trim is not None:
                for fd in trim.fds.values():
                    with contextlib.suppress(OSError):
                        os.close(fd)
                shutil.rmtree(trim.path, ignore_errors=True)
                with self._cond:
                    self.trimmed += 1
                continue
            if bare is not None:
                fds = self._open(bare.path)
                with self._cond:
                    bare.fds = fds
                    if fds:
                        self._holding += 1
                    else:
                        self._open_failed = True  # no descriptors: it is used bare
                    self._ready.append(bare)
                continue
            if not make:
                continue
            made = self._make(path, keep_open)
            with self._cond:
                if made is not None:
                    self._ready.append(Spare(path, made))
                    self.made += 1
                    if made:
                        self._holding += 1
                else:
                    self.failures += 1
                    # a full disk or no descriptor: creation falls back to the caller's
                    # thread; try again only when asked again
                    self._wanted = len(self._ready)

    def _open(self, path: str) -> dict[str, int]:
        """The spare's files opened ({} when they cannot be: then it is used bare)."""
        fds: dict[str, int] = {}
        try:
            for name in FILES:
                fds[name] = os.open(os.path.join(path, name), os.O_RDWR)
        except OSError:
            for fd in fds.values():
                os.close(fd)
            return {}
        return fds

    def _make(self, path: str, keep_open: bool) -> dict[str, int] | None:
        """Make the spare ``path``: its open files' descriptors ({} when not kept open), or
        None when it cannot be made."""
        fds: dict[str, int] = {}
        try:
            os.mkdir(path)
            for name in FILES:
                fd = os.open(os.path.join(path, name), os.O_RDWR | os.O_CREAT | os.O_EXCL)
                if keep_open:
                    fds[name] = fd
                else:
                    os.close(fd)
            if self.fsync:
                _fsync_dir(path)
        except OSError as exc:
            for fd in fds.values():
                os.close(fd)
            if not self.failures:  # once: a full disk would log it at every session opened
                log.warning("cannot make a spare recording directory %s: %s", path, exc)
            shutil.rmtree(path, ignore_errors=True)
            return None
        return fds

    def stats(self) -> dict[str, int]:
        return {
            "spare_recordings_ready": len(self._ready),
            "spare_recordings_made": self.made,
            "spare_recordings_taken": self.taken,
            "spare_recordings_taken_open": self.taken_open,
            "spare_recordings_open_files": self.open_files,
            "spare_recordings_failures": self.failures,
            # removed once in excess of the open sessions' need for trim_after_s
            "spare_recordings_trimmed": self.trimmed,
        }

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread (the spares made stay on disk for the next start) and close the
        descriptors it held."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout_s)
        with self._cond:
            self._close_retired()
            for spare in self._ready:
                for fd in spare.fds.values():
                    with contextlib.suppress(OSError):
                        os.close(fd)
                spare.fds = {}
            self._holding = 0


__all__ = ["FILES", "META", "OLD_META", "PREFIX", "SEGMENT_0", "Spare", "SparePool"]

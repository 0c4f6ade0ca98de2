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

log = logging.getLogger(__name__)

PREFIX = "spare-"
#: The files a spare holds, all empty: the descriptor's temporary file, the acknowledged end,
#: the time index and the segment of position 0 (a recording that starts elsewhere takes none).
SEGMENT_0 = f"{0:020d}.seg"
FILES = ("meta.msgpack.tmp", "acked", "index", SEGMENT_0)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SparePool:
    """Spares under ``root`` (see the module docstring); at most ``capacity`` wanted at once."""

    def __init__(
        self, root: str, fsync: bool, capacity: int = 4096, trim_after_s: float = 60.0
    ) -> None:
        self.root = root
        self.fsync = fsync
        self.capacity = capacity
        self.trim_after_s = trim_after_s  # spares in excess this long are removed
        self._excess_since: float | None = None  # monotonic s: more ready than wanted since
        self.trimmed = 0  # spares removed: in excess of what the open sessions need
        self._ready: deque[str] = deque()
        self._wanted = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.made = 0  # spares made by this process
        self.taken = 0  # spares renamed into recordings
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
                self._ready.append(path)
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
        """Exactly the spare's names, each an empty regular file (``lstat``: a symlink to an
        empty file elsewhere looked whole, and a recording made from it wrote its messages
        through the link; a FIFO failed every append)."""
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
            names = os.listdir(path)
            if sorted(names) != sorted(FILES):
                return False
            for name in names:
                st = os.lstat(os.path.join(path, name))
                if not stat.S_ISREG(st.st_mode) or st.st_size != 0:
                    return False
            return True
        except OSError:
            return False

    @property
    def ready(self) -> int:
        return len(self._ready)

    def _note_excess(self) -> None:
        """(Under the lock.) Mark when the ready spares first exceeded the wanted number."""
        if len(self._ready) > self._wanted:
            if self._excess_since is None:
                self._excess_since = time.monotonic()
        else:
            self._excess_since = None

    def want(self, count: int) -> None:
        """Keep ``count`` spares ready (at most ``capacity``): the thread makes the missing ones
        and trims the ones in excess for ``trim_after_s``."""
        with self._cond:
            self._wanted = max(0, min(count, self.capacity))
            self._note_excess()
            if self._closed or len(self._ready) == self._wanted:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="aeron-spark-spares", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def take(self) -> str | None:
        """A ready spare's path (the caller renames it away), or None."""
        with self._cond:
            if not self._ready:
                return None
            path = self._ready.popleft()
            self.taken += 1
            self._note_excess()
            if len(self._ready) < self._wanted:
                self._cond.notify()
            return path

    def give_back(self, path: str) -> None:
        """A spare taken but not used (its rename failed): ready again."""
        with self._cond:
            self._ready.appendleft(path)
            self.taken -= 1
            self._note_excess()

    def _run(self) -> None:
        while True:
            with self._cond:
                trim = None
                while not self._closed and len(self._ready) >= self._wanted:
                    since = self._excess_since
                    if since is None:
                        self._cond.wait()
                        continue
                    wait_s = since + self.trim_after_s - time.monotonic()
                    if wait_s <= 0:
                        trim = self._ready.pop()  # the newest: takes go oldest first
                        self._note_excess()
                        break
                    self._cond.wait(wait_s)
                if self._closed:
                    return
                if trim is None:
                    path = os.path.join(self.root, f"{PREFIX}{self._next}")
                    self._next += 1
            if trim is not None:
                shutil.rmtree(trim, ignore_errors=True)
                with self._cond:
                    self.trimmed += 1
                continue
            made = self._make(path)
            with self._cond:
                if made:
                    self._ready.append(path)
                    self.made += 1
                else:
                    self.failures += 1
                    # a full disk or no descriptor: creation falls back to the caller's
                    # thread; try again only when asked again
                    self._wanted = len(self._ready)

    def _make(self, path: str) -> bool:
        try:
            os.mkdir(path)
            for name in FILES:
                os.close(os.open(os.path.join(path, name), os.O_RDWR | os.O_CREAT | os.O_EXCL))
            if self.fsync:
                _fsync_dir(path)
        except OSError as exc:
            if not self.failures:  # once: a full disk would log it at every session opened
                log.warning("cannot make a spare recording directory %s: %s", path, exc)
            shutil.rmtree(path, ignore_errors=True)
            return False
        return True

    def stats(self) -> dict[str, int]:
        return {
            "spare_recordings_ready": len(self._ready),
            "spare_recordings_made": self.made,
            "spare_recordings_taken": self.taken,
            "spare_recordings_failures": self.failures,
            # removed once in excess of the open sessions' need for trim_after_s
            "spare_recordings_trimmed": self.trimmed,
        }

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread (the spares made stay on disk for the next start)."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout_s)


__all__ = ["FILES", "PREFIX", "SEGMENT_0", "SparePool"]

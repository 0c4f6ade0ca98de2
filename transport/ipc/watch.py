"""A wake-up for new IPC log files: Linux ``inotify`` on the driver's IPC directory.

An IPC subscription with no image had nothing to wait on but the clock: it scanned the directory
every 20 ms and its driver's conductor woke every 10 ms to step it, a hundred wake-ups a second
for an idle handshake server (issue 31). A publisher's log file is renamed into the directory
once its header is written (:mod:`.logfile`), so ``IN_MOVED_TO`` / ``IN_CREATE`` say when a scan
can find something. The watch's descriptor is one more readable object in the driver's
``select``; :attr:`DirectoryWatch.generation` counts the changes seen, and a subscription scans
when it moved since its last scan (or a file it found was not ready: it polls until it is).

One watch per driver (inotify instances are few: 128 per user by default). Where inotify is
missing or refused (another OS, the limit reached) :func:`open_watch` returns None and the
subscriptions poll as before. A watch whose directory went (a closing driver removes the folder
when it is empty: ``Driver.close``) makes it again and watches the new one, its generation moved
so the subscriptions scan (what came meanwhile is found); one that cannot says ``broken`` and
they poll from then on. One that lost events (``IN_Q_OVERFLOW``: more came than the kernel
queues, ``fs.inotify.max_queued_events``, before the driver read them, a flood of files made in
the directory) is counted (``ipc_watch_overflows``), watched anew (its directory may have gone
among the lost events) and its generation moved, so the subscriptions scan once and then wait on
it again; it used to say ``broken`` and they polled every 20 ms for good.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
_MASK = IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF
_MOVED_AWAY = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED  # the directory went: watched anew
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, len bytes)


class DirectoryWatch:
    """An inotify descriptor watching one directory (see the module)."""

    def __init__(
        self,
        fd: int,
        directory: Path,
        wd: int = -1,
        add_watch: Any = None,
        counters: Any = None,
    ) -> None:
        self._fd = fd
        self._counters = counters  # the driver's SystemCounters (ipc_watch_overflows)
        self._wd = wd  # the directory's watch (events of an older one are stale)
        self._add_watch = add_watch  # libc's inotify_add_watch (None: cannot watch anew)
        self.rearmed = 0  # times the directory went (or events were lost) and was watched anew
        self.overflows = 0  # times the kernel's queue overflowed (events lost: rescanned)
        self.directory = directory
        self.generation = 0  # changes seen (a subscription compares it with its last scan's)
        self.broken = False  # the directory went and could not be watched anew: poll from now on
        self.closed = False

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> bool:
        """Read what is pending (never blocks); True if the directory changed."""
        if self.closed:
            return False
        changed = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return changed
            except OSError:
                self.broken = True
                self.generation += 1
                return True
            if not data:
                return changed
            changed = True
            self.generation += 1
            at = 0
            gone = False
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                if mask & IN_Q_OVERFLOW:
                    # events were lost (the directory's going among them, maybe): counted,
                    # watched anew and rescanned
                    gone = True
                    self.overflows += 1
                    if self._counters is not None:
                        self._counters.ipc_watch_overflows += 1
                elif mask & _MOVED_AWAY and wd == self._wd:
                    gone = True
                at += _EVENT.size + length
            if gone and not self.broken:
                self._rearm()

    def _rearm(self) -> None:
        """The directory went (or events were lost): make it again if missing and watch it
        (the same watch when it is the same directory), or say ``broken``."""
        wd = -1
        for _ in range(16 if self._add_watch is not None else 0):
            try:
                os.makedirs(self.directory, exist_ok=True)
            except FileNotFoundError:
                continue  # its parent removed meanwhile (a closing driver's default directory)
            except OSError:
                break
            wd = self._add_watch(self._fd, os.fsencode(str(self.directory)), _MASK)
            if wd >= 0 or ctypes.get_errno() != errno.ENOENT:
                break  # else removed again between the two (another closing driver): again
        if wd < 0:
            self.broken = True
            return
        self._wd = wd
        self.rearmed += 1
        self.generation += 1  # the subscriptions scan the new directory

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._fd)


def open_watch(directory: Path, counters: Any = None) -> DirectoryWatch | None:
    """A watch on ``directory`` (created if missing), or None where inotify is not available;
    ``counters``: the driver's (the watch counts its overflows there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        init1 = libc.inotify_init1
        add_watch = libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    fd = init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        log.debug("inotify_init1: errno %d (IPC subscriptions poll)", ctypes.get_errno())
        return None
    wd = -1
    for _ in range(16):  # another process's closing driver may remove it when empty
        try:
            os.makedirs(directory, exist_ok=True)
        except FileNotFoundError:
            continue  # its parent removed meanwhile
        except OSError:
            break
        wd = add_watch(fd, os.fsencode(str(directory)), _MASK)
        if wd >= 0 or ctypes.get_errno() != errno.ENOENT:
            break
    if wd < 0:
        log.debug("inotify_add_watch %s: errno %d (polling)", directory, ctypes.get_errno())
        os.close(fd)
        return None
    return DirectoryWatch(fd, directory, wd, add_watch, counters)


__all__ = ["DirectoryWatch", "open_watch"]

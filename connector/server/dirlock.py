"""One server per data directory: an exclusive ``flock`` on ``<directory>/server.lock``.

Two servers on one directory would both append to the catalog and to recordings with the same
ids, rewrite each other's ``local-read.token`` and replay positions neither wrote. The lock is
taken before anything in the directory is opened and held for the server's life; the kernel
drops it when the process dies (``kill -9`` included), so a crash never leaves a stale lock. The
file keeps the holder's pid, only to name it in the error (the lock, not the file, decides).

``flock`` locks belong to an open file description: a second server in the same process is
refused too. Over NFS, Linux maps ``flock`` to a POSIX byte-range lock on the server.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from aeron_spark.connector.errors import DirectoryInUseError, DirectoryUnsafeError

LOCK_FILE = "server.lock"


def check_directory(directory: str) -> None:
    """Refuse (:class:`DirectoryUnsafeError`) a data directory another user may write into: one
    owned by a user other than the server's (or root), or writable by others. Such a user could
    plant a symlink where the server creates a file (``server.lock``, ``stat.json``'s temporary
    file, a recording's) and have the server truncate or overwrite any file the server's user
    may write; or pre-create the directory in a shared place (``/tmp``) before the server first
    starts. Group-writable is allowed (user-private groups, umask 002). A symlink to a safe
    directory is fine (the directory itself is checked)."""
    st = os.stat(directory)
    owner_ok = st.st_uid in (os.geteuid(), 0)
    if owner_ok and not st.st_mode & stat.S_IWOTH:
        return
    mode = stat.S_IMODE(st.st_mode)
    why = (
        f"it is owned by uid {st.st_uid}, not by this server's user (uid {os.geteuid()})"
        if not owner_ok
        else f"it is writable by every user (mode {mode:04o})"
    )
    raise DirectoryUnsafeError(
        f"the data directory {directory} is not safe: {why}; another user could plant "
        "symlinks there and have the server overwrite files. Give the server a directory of "
        "its own user, not writable by others: chmod o-w it, or name a subdirectory the server "
        "will make (e.g. --dir DIR/server under a shared or world-writable volume)",
        directory=directory,
        owner_uid=st.st_uid,
        mode=f"{mode:04o}",
    )


class DirectoryLock:
    """Held while the object is open; :meth:`release` (or process exit) gives it up."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        # never through a symlink (check_directory keeps others from planting one)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            who = f"pid {holder}" if holder is not None else "another process"
            raise DirectoryInUseError(
                f"the directory {self.directory} is in use by another stream server ({who}, "
                f"holding {self.path}); stop it or give this server its own --dir",
                directory=self.directory,
                pid=holder,
                lock_file=self.path,
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # a full disk: the lock is held all the same, only the pid is not shown
            pass
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no pid of a server that is gone (the next holder writes its own)
        except OSError:
            pass
        os.close(fd)  # closing the only descriptor of the open file description unlocks it


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


__all__ = ["LOCK_FILE", "DirectoryLock", "check_directory"]

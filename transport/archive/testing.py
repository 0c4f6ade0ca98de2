"""Helpers for testing storage faults of recordings (like ``trio.testing``).

* :func:`small_tmpfs`: a real, small file system (tmpfs) mounted for the test, to fill up.
* :func:`fill`: fill a file system to the last byte with one file (deleted to free the space).
* :func:`open_fds`: descriptors a process has open, counted in ``/proc/<pid>/fd``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator


class MountUnavailable(RuntimeError):
    """This machine cannot mount a file system for a test (not root, no mount namespace)."""


@contextlib.contextmanager
def small_tmpfs(
    size_bytes: int, prefix: str = "aeron-spark-tmpfs-", nr_inodes: int | None = None
) -> Iterator[str]:
    """Mount a tmpfs of ``size_bytes`` (and ``nr_inodes`` names, when given: a tmpfs makes
    directories and empty files on a disk full of data) on a fresh directory (its name holds
    the pid); unmount and remove it afterwards. Raises :class:`MountUnavailable` when mounting
    is impossible."""
    if shutil.which("mount") is None:
        raise MountUnavailable("no mount command on this machine")
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    options = f"size={size_bytes},mode=0755"
    if nr_inodes is not None:
        options += f",nr_inodes={nr_inodes}"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", path],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        os.rmdir(path)
        raise MountUnavailable(
            f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            os.rmdir(path)


def fill(directory: str, name: str = "filler", leave_bytes: int = 0) -> str:
    """Write one file in ``directory`` until its file system is full (or only ``leave_bytes``
    are left); its path (delete it to free the space)."""
    path = os.path.join(directory, name)
    chunk = b"\0" * (64 * 1024)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            st = os.statvfs(directory)
            room = st.f_bavail * st.f_frsize - leave_bytes
            if room <= 0:
                break
            try:
                if os.write(fd, chunk[: min(len(chunk), room)]) <= 0:
                    break
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return path


def open_fds(pid: int | str = "self", *, but_containing: str | None = None) -> int:
    """Descriptors process ``pid`` has open (``/proc/<pid>/fd``; less the one counting);
    ``but_containing``: not counting those of files whose path contains it (a store's spare
    recording directories, ``/recordings/spare-``, whose files the spares' thread holds open
    within its budget while sessions come and go)."""
    fd_dir = f"/proc/{pid}/fd"
    names = os.listdir(fd_dir)
    count = len(names) - (1 if pid in ("self", os.getpid()) else 0)
    if but_containing is not None:
        for name in names:
            try:
                if but_containing in os.readlink(os.path.join(fd_dir, name)):
                    count -= 1
            except OSError:  # closed since the listing (or the counting one)
                pass
    return count


__all__ = ["MountUnavailable", "fill", "open_fds", "small_tmpfs"]

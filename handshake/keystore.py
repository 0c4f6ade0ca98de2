"""The on-disk key store: the server's private key, the client's identity key and the server
keys a client knows.

Layout of a key store directory (created with mode 0700, files 0600)::

    server.key       the server's X25519 private key, 64 hex digits (created on first use)
    client.key       this client's static X25519 private key, 64 hex digits (created on first
                     use): its identity towards servers that take ``--authorized-keys``
    known_servers    one line per server: "<endpoint> <public key hex>", like ssh's known_hosts

Clients trust a server key on first use and refuse a *changed* key with an error that says how to
accept it deliberately (``KeyStore.forget(endpoint)``, ``aeron-spark keys forget ENDPOINT``, or
deleting the line). Writers take an exclusive ``flock`` so concurrent Spark tasks on one host do
not lose each other's lines.

A client connects many times: :meth:`KeyStore.check_server` remembers what it last read of
``known_servers`` with the file's identity (device, inode, size, mtime, ctime). While ``lstat``
still shows that identity, a known key that matches costs two ``lstat`` calls (directory and file,
still checked to be ours and private) and no lock, open or parse. Any write changes the identity
(appends change size and times, ``forget`` replaces the file), so the next connect reads it again;
a read made while the file's ctime is within :data:`RACY_WINDOW_NS` of the clock is not remembered
(a same-size rewrite in the same timestamp tick would not change the identity, as git's "racily
clean" entries). Unknown and mismatching keys always take the locked path, so trust on first use
is written under the lock and a changed key is refused as before.

The private keys (``server.key``, ``client.key``) are remembered the same way, once per process
for each file: a client that opens thousands of sessions (or reopens them all after a pause lost
them) takes the lock and reads its key once, then checks the file with two ``lstat`` calls per
connect. A key file replaced or rewritten on disk changes its identity, so the next connect reads
the new key under the lock (sessions already open keep the key they were opened with); a key
file removed is created afresh under the lock, as on first use.

Nothing is trusted that another local user could have prepared: the directory must be a real
directory (not a symbolic link) owned by us with mode 0700 (a pre-created one that is not is
refused, not repaired); every file is opened with ``O_NOFOLLOW`` and must be ours and not
accessible by group or others; files are replaced through a fresh ``mkstemp`` file
(``O_CREAT|O_EXCL|O_NOFOLLOW``, random name) renamed over the old one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.handshake.client_counters import count
from aeron_spark.handshake.crypto import fingerprint, public_bytes
from aeron_spark.handshake.errors import KeyRefusedError, KeyStoreError, KeyStoreLockedError

SERVER_KEY_FILE = "server.key"
CLIENT_KEY_FILE = "client.key"
KNOWN_SERVERS_FILE = "known_servers"
ENV_KEY_STORE = "AERON_SPARK_KEY_STORE"
# A read of known_servers is remembered only if the file's ctime is older than this when it is
# read: coarse file-system clocks (1 s on ext4 with small inodes, 2 s on FAT) could hide a
# same-size rewrite made in the same tick right after the read.
RACY_WINDOW_NS = 2_000_000_000
# How long a key store waits for its lock (``.lock``) that another process holds, unless told
# (a client waits its connect's timeout): any process of the user can hold it (a task paused
# mid-write, a stuck command), and the wait was for good.
LOCK_WAIT_S = 10.0

_FileIdentity = tuple[int, int, int, int, int]


def _identity(st: os.stat_result) -> _FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# Private keys this process has read, by absolute path: (identity of the file then, the key).
# A process opens many sessions (2,048 in the scale benchmark, all again after it lost them in a
# pause): each connect checks the file with two lstat calls instead of taking the store's lock
# and reading it (see the module docstring).
_private_cache: dict[str, tuple[_FileIdentity, X25519PrivateKey]] = {}
_private_lock = threading.Lock()
_private_reads = [0]


def _count_read() -> None:
    with _private_lock:
        _private_reads[0] += 1


def private_key_reads() -> int:
    """How many times this process opened and parsed a private key file of a key store."""
    return _private_reads[0]


def default_key_store_dir() -> Path:
    """``$AERON_SPARK_KEY_STORE``, else ``~/.aeron-spark/keys``."""
    env = os.environ.get(ENV_KEY_STORE)
    if env:
        return Path(env)
    return Path.home() / ".aeron-spark" / "keys"


class KeyStore:
    """Keys under one directory (see the module docstring)."""

    def __init__(
        self, directory: str | os.PathLike[str] | None = None, *, lock_wait_s: float = LOCK_WAIT_S
    ) -> None:
        self.directory = Path(directory) if directory is not None else default_key_store_dir()
        self.lock_wait_s = lock_wait_s
        # a deadline of the calling thread's (waits_until): a connect's, which its wait for a
        # handshake slot already used part of
        self._until = threading.local()
        # (identity of known_servers when read, what it said): see the module docstring
        self._known_cache: tuple[_FileIdentity, dict[str, bytes]] | None = None
        self.known_reads = 0  # times known_servers was opened and parsed

    # ------------------------------------------------------------------ server side

    def server_private_key(self) -> X25519PrivateKey:
        """The server's private key, created (0600) on first use."""
        return self._private_key(SERVER_KEY_FILE)

    def client_private_key(self) -> X25519PrivateKey:
        """This client's static (identity) private key, created (0600) on first use."""
        return self._private_key(CLIENT_KEY_FILE)

    def _private_key(self, name: str) -> X25519PrivateKey:
        path = self.directory / name
        cached = self._cached_private(path)
        if cached is not None:
            return cached
        with self._locked():
            cached = self._cached_private(path)  # another thread read it while we waited
            if cached is not None:
                return cached
            read = self._read_private_stat(path)
            if read is None:
                key = X25519PrivateKey.generate()
                self._write_private(path, key.private_bytes_raw().hex() + "\n")
                return key  # remembered when read next, outside the racy window
            text, st = read
            _count_read()
            try:
                key = X25519PrivateKey.from_private_bytes(bytes.fromhex(text.strip()))
            except ValueError as exc:
                raise KeyStoreError(f"{path} does not hold a 32-byte hex key: {exc}") from exc
            if time.time_ns() - st.st_ctime_ns >= RACY_WINDOW_NS:
                with _private_lock:
                    _private_cache[str(path.absolute())] = (_identity(st), key)
            return key

    def _cached_private(self, path: Path) -> X25519PrivateKey | None:
        """``path``'s key as this process last read it, if the file has not changed since
        (directory and file checked to be ours and private, as on every read); None if not
        known that way (then the locked path reads it)."""
        cached = _private_cache.get(str(path.absolute()))
        if cached is None:
            return None
        self._check_directory()
        try:
            st = os.lstat(path)
        except OSError:
            return None  # gone or unreadable: the locked path says what is wrong
        if stat.S_ISLNK(st.st_mode):
            return None  # the locked path refuses it with its message
        self._check_private(path, st)
        return cached[1] if _identity(st) == cached[0] else None

    # ------------------------------------------------------------------ client side

    def known_servers(self) -> dict[str, bytes]:
        path = self.directory / KNOWN_SERVERS_FILE
        self._check_directory()
        try:
            fd = self._open_private(path, os.O_RDONLY)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise KeyStoreError(f"cannot read {path}: {exc}") from exc
        with os.fdopen(fd, "r") as fh:
            st = os.fstat(fh.fileno())  # before reading: a write during the read changes it
            text = fh.read()
        self.known_reads += 1
        known = self._parse_known(path, text)
        if time.time_ns() - st.st_ctime_ns >= RACY_WINDOW_NS:
            self._known_cache = (_identity(st), dict(known))
        return known

    def _parse_known(self, path: Path, text: str) -> dict[str, bytes]:
        known: dict[str, bytes] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError("expected '<endpoint> <key hex>'")
                key = bytes.fromhex(parts[1])
                if len(key) != 32:
                    raise ValueError("a key is 32 bytes")
            except ValueError as exc:
                raise KeyStoreError(f"{path}:{number}: {exc}") from exc
            known[parts[0]] = key
        return known

    def _cached_known(self, endpoint: str) -> bytes | None:
        """``endpoint``'s key from the last read of known_servers if the file has not changed
        since (directory and file checked as on every read); None if not known that way."""
        cache = self._known_cache
        if cache is None:
            return None
        self._check_directory()
        path = self.directory / KNOWN_SERVERS_FILE
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreError(f"cannot read {path}: {exc}") from exc
        if stat.S_ISLNK(st.st_mode):
            return None  # the locked path refuses it with its message
        self._check_private(path, st)
        if _identity(st) != cache[0]:
            return None
        return cache[1].get(endpoint)

    def check_server(
        self,
        endpoint: str,
        public_key: bytes,
        *,
        pinned: bytes | None = None,
        trust_on_first_use: bool = True,
    ) -> None:
        """Accept ``public_key`` for ``endpoint`` or raise :class:`KeyRefusedError`.

        A pinned key (``server_key`` option) is compared and nothing is stored. Otherwise the
        known key must match; an unknown endpoint is remembered when ``trust_on_first_use``.
        """
        shown = fingerprint(public_key)
        if pinned is not None:
            if pinned != public_key:
                raise KeyRefusedError(
                    f"the server presented key {shown}, but the pinned server_key is "
                    f"{fingerprint(pinned)}; check the server's key "
                    "('aeron-spark keys show --dir SERVER_KEY_DIR') and pin that one",
                    endpoint,
                )
            return
        if self._cached_known(endpoint) == public_key:
            return  # known and matching, file unchanged since it was read: no lock, no parse
        with self._locked():
            known = self.known_servers().get(endpoint)
            if known is None:
                if not trust_on_first_use:
                    raise KeyRefusedError(
                        f"unknown server key {shown} and trust on first use is off; pin it with "
                        "server_key=<hex> or turn trust_on_first_use on",
                        endpoint,
                    )
                self._append_known(endpoint, public_key)
                return
            if known != public_key:
                raise KeyRefusedError(
                    f"the server's key CHANGED: it presented {shown}, but {fingerprint(known)} is "
                    f"known for {endpoint} in {self.directory / KNOWN_SERVERS_FILE}. If the server "
                    f"was re-keyed on purpose, run 'aeron-spark keys forget {endpoint}' (or delete "
                    "that line) and connect again",
                    endpoint,
                )

    def forget(self, endpoint: str) -> bool:
        """Remove ``endpoint``'s known key; True if there was one."""
        with self._locked():
            known = self.known_servers()
            if endpoint not in known:
                return False
            del known[endpoint]
            body = "".join(f"{ep} {key.hex()}\n" for ep, key in sorted(known.items()))
            self._write_private(self.directory / KNOWN_SERVERS_FILE, body)
            return True

    # ------------------------------------------------------------------ files

    def _append_known(self, endpoint: str, public_key: bytes) -> None:
        path = self.directory / KNOWN_SERVERS_FILE
        fd = self._open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "a") as fh:
            fh.write(f"{endpoint} {public_key.hex()}\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _write_private(self, path: Path, text: str) -> None:
        # mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, an unpredictable name in our directory
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".new", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _open_private(self, path: Path, flags: int) -> int:
        """``path`` opened without following a symbolic link, checked to be ours and private."""
        try:
            # O_NONBLOCK: a FIFO in a key's place opens at once (then refused as not a regular
            # file) where it waited for a writer for good; no effect on a regular file
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise KeyStoreError(
                    f"{path} is a symbolic link; the key store does not follow links "
                    "(replace it with the file itself)"
                ) from exc
            raise
        try:
            self._check_private(path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_private(self, path: Path) -> str | None:
        """The text of a private file, None if there is none."""
        read = self._read_private_stat(path)
        return None if read is None else read[0]

    def _read_private_stat(self, path: Path) -> tuple[str, os.stat_result] | None:
        """The text of a private file and its status before the read, None if there is none."""
        try:
            fd = self._open_private(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreError(f"cannot read {path}: {exc}") from exc
        with os.fdopen(fd, "r") as fh:
            st = os.fstat(fh.fileno())  # before reading: a write during the read changes it
            return fh.read(), st

    def _check_private(self, path: Path, st: os.stat_result | None = None) -> None:
        st = st if st is not None else os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise KeyStoreError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise KeyStoreError(
                f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}); "
                "another user could have written it: remove it"
            )
        mode = st.st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyStoreError(
                f"{path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                f"run 'chmod 600 {path}'"
            )

    def _check_directory(self) -> None:
        """The directory, if it exists, must be a real directory of ours with mode 0700."""
        directory = self.directory
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise KeyStoreError(
                f"key store {directory} is a symbolic link; the key store does not follow links "
                "(point --key-store at the directory itself)"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise KeyStoreError(f"key store {directory} is not a directory")
        if st.st_uid != os.geteuid():
            raise KeyStoreError(
                f"key store {directory} is owned by uid {st.st_uid}, not by this user "
                f"(uid {os.geteuid()}); another user could read or replace its keys: use a "
                "directory of your own"
            )
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyStoreError(
                f"key store {directory} is accessible by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):o}); run 'chmod 700 {directory}'"
            )

    @contextlib.contextmanager
    def waits_until(self, deadline: float) -> Iterator[None]:
        """Meanwhile this thread waits for the lock no later than ``deadline``
        (``time.monotonic()``) nor longer than :attr:`lock_wait_s`: a connect's one deadline
        (its wait for a handshake slot came out of it; the lock's own whole wait after that
        made a connect take nearly twice its timeout)."""
        before = getattr(self._until, "deadline", None)
        self._until.deadline = deadline
        try:
            yield
        finally:
            self._until.deadline = before

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.directory, 0o700)
            self._check_directory()
            fd = self._open_private(self.directory / ".lock", os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise KeyStoreError(f"cannot use key store {self.directory}: {exc}") from exc
        try:
            self._lock(fd)
            yield
        finally:
            os.close(fd)

    def _lock(self, fd: int) -> None:
        """``flock`` within :attr:`lock_wait_s` and the thread's :meth:`waits_until` deadline
        (tried again in sleeps of 1 to 50 ms: ``flock`` itself takes no timeout), else
        :class:`KeyStoreLockedError`."""
        started = time.monotonic()
        deadline = started + self.lock_wait_s
        until = getattr(self._until, "deadline", None)
        if until is not None and until < deadline:
            deadline = until
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    count("key_store_lock_timeouts")  # the process's registry counter
                    bound = (
                        "the connect's timeout ran out"
                        if deadline == until
                        else f"the {self.lock_wait_s:g} s it may"
                    )
                    raise KeyStoreLockedError(
                        f"key store {self.directory} is locked by another process "
                        f"({self.directory / '.lock'}): waited {time.monotonic() - started:.1f} s, "
                        f"{bound} "
                        "(KEY_STORE_LOCKED): a process of this user holding it is stopped or "
                        "stuck ('fuser -v' on the file names it)"
                    ) from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.05)


def server_public_key_hex(directory: str | os.PathLike[str] | None = None) -> str:
    """The public key (hex) of the server key in ``directory`` (creating it if needed)."""
    return public_bytes(KeyStore(directory).server_private_key()).hex()


def client_public_key_hex(directory: str | os.PathLike[str] | None = None) -> str:
    """The public key (hex) of the client key in ``directory`` (creating it if needed)."""
    return public_bytes(KeyStore(directory).client_private_key()).hex()


def load_client_key(path: str | os.PathLike[str]) -> X25519PrivateKey:
    """A client private key from a key file given explicitly (``clientKey``, ``--client-key``):
    64 hex digits, a regular file of ours, not a symbolic link, not readable by group or others
    (the same rules as the key store's own files). Never created: a missing file is an error."""
    path = Path(path)
    text = KeyStore(path.parent)._read_private(path)
    if text is None:
        raise KeyStoreError(
            f"client key file {path} does not exist (create one with "
            "'aeron-spark keys show --client --key-store DIR' and point at DIR/client.key)"
        )
    try:
        return X25519PrivateKey.from_private_bytes(bytes.fromhex(text.strip()))
    except ValueError as exc:
        raise KeyStoreError(f"{path} does not hold a 32-byte hex key: {exc}") from exc


__all__ = [
    "CLIENT_KEY_FILE",
    "ENV_KEY_STORE",
    "KeyStore",
    "client_public_key_hex",
    "default_key_store_dir",
    "load_client_key",
    "private_key_reads",
    "server_public_key_hex",
]

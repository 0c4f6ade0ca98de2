"""The on-disk key store: the server's private key and the server keys a client knows.

Layout of a key store directory (created with mode 0700, files 0600)::

    server.key       the server's X25519 private key, 64 hex digits (created on first use)
    known_servers    one line per server: "<endpoint> <public key hex>", like ssh's known_hosts

Clients trust a server key on first use and refuse a *changed* key with an error that says how to
accept it deliberately (``KeyStore.forget(endpoint)``, ``aeron-spark keys forget ENDPOINT``, or
deleting the line). Writers take an exclusive ``flock`` so concurrent Spark tasks on one host do
not lose each other's lines. A file readable by group or others is refused, not silently used.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from aeron_spark.handshake.crypto import fingerprint, public_bytes
from aeron_spark.handshake.errors import KeyRefusedError, KeyStoreError
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

SERVER_KEY_FILE = "server.key"
KNOWN_SERVERS_FILE = "known_servers"
ENV_KEY_STORE = "AERON_SPARK_KEY_STORE"


def default_key_store_dir() -> Path:
    """``$AERON_SPARK_KEY_STORE``, else ``~/.aeron-spark/keys``."""
    env = os.environ.get(ENV_KEY_STORE)
    if env:
        return Path(env)
    return Path.home() / ".aeron-spark" / "keys"


class KeyStore:
    """Keys under one directory (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_key_store_dir()

    # ------------------------------------------------------------------ server side

    def server_private_key(self) -> X25519PrivateKey:
        """The server's private key, created (0600) on first use."""
        path = self.directory / SERVER_KEY_FILE
        with self._locked():
            if path.exists():
                self._check_private(path)
                text = path.read_text().strip()
                try:
                    return X25519PrivateKey.from_private_bytes(bytes.fromhex(text))
                except ValueError as exc:
                    raise KeyStoreError(f"{path} does not hold a 32-byte hex key: {exc}") from exc
            key = X25519PrivateKey.generate()
            raw = key.private_bytes_raw()
            self._write_private(path, raw.hex() + "\n")
            return key

    # ------------------------------------------------------------------ client side

    def known_servers(self) -> dict[str, bytes]:
        path = self.directory / KNOWN_SERVERS_FILE
        if not path.exists():
            return {}
        self._check_private(path)
        known: dict[str, bytes] = {}
        for number, line in enumerate(path.read_text().splitlines(), 1):
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
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(f"{endpoint} {public_key.hex()}\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _write_private(self, path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _check_private(self, path: Path) -> None:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyStoreError(
                f"{path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                f"run 'chmod 600 {path}'"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise KeyStoreError(f"cannot use key store {self.directory}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def server_public_key_hex(directory: str | os.PathLike[str] | None = None) -> str:
    """The public key (hex) of the server key in ``directory`` (creating it if needed)."""
    return public_bytes(KeyStore(directory).server_private_key()).hex()


__all__ = ["ENV_KEY_STORE", "KeyStore", "default_key_store_dir", "server_public_key_hex"]

"""The key store: server key created 0600, trust on first use, changed keys refused, pinning."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.handshake import keystore
from aeron_spark.handshake.crypto import public_bytes
from aeron_spark.handshake.errors import KeyRefusedError, KeyStoreError
from aeron_spark.handshake.keystore import KeyStore

A, B = bytes(range(32)), bytes(range(1, 33))


def test_server_key_is_created_once_with_owner_only_permissions(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    key = store.server_private_key()
    assert public_bytes(store.server_private_key()) == public_bytes(key)
    assert stat.S_IMODE((tmp_path / "keys" / "server.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


def test_group_readable_key_file_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.server_private_key()
    os.chmod(tmp_path / "server.key", 0o640)
    with pytest.raises(KeyStoreError, match="chmod 600"):
        store.server_private_key()


def test_trust_on_first_use_then_a_changed_key_is_refused_with_instructions(
    tmp_path: Path,
) -> None:
    store = KeyStore(tmp_path)
    store.check_server("srv:4000", A)
    store.check_server("srv:4000", A)
    assert store.known_servers() == {"srv:4000": A}
    assert stat.S_IMODE((tmp_path / "known_servers").stat().st_mode) == 0o600
    with pytest.raises(KeyRefusedError, match="CHANGED.*aeron-spark keys forget srv:4000"):
        store.check_server("srv:4000", B)
    assert store.forget("srv:4000") and not store.forget("srv:4000")
    store.check_server("srv:4000", B)  # accepted deliberately after forgetting
    assert store.known_servers() == {"srv:4000": B}


def test_unknown_key_without_trust_on_first_use_and_pinned_keys(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    with pytest.raises(KeyRefusedError, match="trust on first use is off"):
        store.check_server("srv:1", A, trust_on_first_use=False)
    store.check_server("srv:1", A, pinned=A)
    with pytest.raises(KeyRefusedError, match="pinned"):
        store.check_server("srv:1", B, pinned=A)
    assert store.known_servers() == {}


def test_malformed_known_servers_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "known_servers"
    path.write_text("srv:1 " + A.hex() + "\nbroken-line\n")
    os.chmod(path, 0o600)
    with pytest.raises(KeyStoreError, match="known_servers:2"):
        KeyStore(tmp_path).known_servers()


# ------------------------------------------------------------------ issue 22, item 7

OTHER_UID = 54321


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_a_pre_created_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    os.chown(keys, OTHER_UID, -1)
    with pytest.raises(KeyStoreError, match=f"owned by uid {OTHER_UID}"):
        KeyStore(keys).server_private_key()
    assert not (keys / "server.key").exists()


def test_a_directory_others_can_enter_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    os.chmod(keys, 0o755)
    with pytest.raises(KeyStoreError, match="chmod 700"):
        KeyStore(keys).server_private_key()
    assert not (keys / "server.key").exists()


def test_a_symlinked_key_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "keys").symlink_to(real)
    with pytest.raises(KeyStoreError, match="symbolic link"):
        KeyStore(tmp_path / "keys").server_private_key()


def test_a_symlinked_key_file_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.key"
    elsewhere.write_text(X25519PrivateKey.generate().private_bytes_raw().hex() + "\n")
    os.chmod(elsewhere, 0o600)
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "server.key").symlink_to(elsewhere)
    with pytest.raises(KeyStoreError, match="symbolic link"):
        KeyStore(keys).server_private_key()
    (keys / "known_servers").symlink_to(elsewhere)
    with pytest.raises(KeyStoreError, match="symbolic link"):
        KeyStore(keys).check_server("srv:1", A)


def test_a_predictable_temporary_file_is_not_written_through(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    store = KeyStore(keys)
    store.check_server("srv:1", A)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (keys / "known_servers.tmp").symlink_to(victim)  # the old fixed temporary name
    store.check_server("srv:2", B)
    assert store.forget("srv:1")
    assert victim.read_text() == "untouched\n"
    assert store.known_servers() == {"srv:2": B}
    assert [p.name for p in keys.iterdir() if p.name.startswith("known_servers.")] == [
        "known_servers.tmp"
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    store.server_private_key()
    store.check_server("srv:1", A)
    os.chown(tmp_path / "keys" / "server.key", OTHER_UID, -1)
    with pytest.raises(KeyStoreError, match=f"owned by uid {OTHER_UID}"):
        store.server_private_key()
    os.chown(tmp_path / "keys" / "known_servers", OTHER_UID, -1)
    with pytest.raises(KeyStoreError, match=f"owned by uid {OTHER_UID}"):
        store.known_servers()


# ------------------------------------------------------------------ issue 19: a cached read


def _aged(store: KeyStore) -> None:
    """Wait (bounded) until known_servers' last change is older than the racy window, so that a
    read of it may be remembered (see the keystore module docstring)."""
    path = store.directory / "known_servers"
    deadline = time.monotonic() + keystore.RACY_WINDOW_NS / 1e9 + 5
    while time.time_ns() - os.lstat(path).st_ctime_ns < keystore.RACY_WINDOW_NS:
        assert time.monotonic() < deadline, "the file's ctime does not age"
        time.sleep(0.05)


def _in_other_process(directory: Path, code: str) -> None:
    """Run ``code`` with ``store`` = KeyStore(directory) in another Python process."""
    script = (
        "from aeron_spark.handshake.keystore import KeyStore\n"
        f"store = KeyStore({str(directory)!r})\n"
    )
    subprocess.run([sys.executable, "-c", script + code], check=True, timeout=60)


def test_a_known_matching_key_costs_no_lock_and_no_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = KeyStore(tmp_path / "keys")
    store.check_server("srv:1", A)  # trust on first use: written under the lock
    _aged(store)
    counts = {"flock": 0, "open": 0}
    real_flock, real_open = fcntl.flock, os.open

    def counting_flock(fd: int, op: int) -> None:
        counts["flock"] += 1
        real_flock(fd, op)

    def counting_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if str(path).startswith(str(tmp_path)):
            counts["open"] += 1
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(fcntl, "flock", counting_flock)
    monkeypatch.setattr(os, "open", counting_open)
    for _ in range(50):
        store.check_server("srv:1", A)
    # the first connect reads the file once (lock + .lock + known_servers), the rest read nothing
    assert counts == {"flock": 1, "open": 2}
    assert store.known_reads == 1
    # a mismatch still takes the lock and is refused exactly as before
    with pytest.raises(KeyRefusedError, match="CHANGED.*aeron-spark keys forget srv:1"):
        store.check_server("srv:1", B)
    assert counts["flock"] == 2


def test_the_cached_read_sees_another_process_write(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    store = KeyStore(keys)
    store.check_server("srv:1", A)
    _aged(store)
    store.check_server("srv:1", A)  # read and remembered
    store.check_server("srv:1", A)  # from memory
    assert store.known_reads == 1  # the first connect found no file
    # another process re-keys srv:1 deliberately (forget, then trust B on first use)
    _in_other_process(
        keys, f"store.forget('srv:1'); store.check_server('srv:1', bytes.fromhex({B.hex()!r}))"
    )
    with pytest.raises(KeyRefusedError, match="CHANGED"):
        store.check_server("srv:1", A)
    store.check_server("srv:1", B)
    # another process removes the entry: it is unknown again, not trusted from memory
    _aged(store)
    store.check_server("srv:1", B)
    _in_other_process(keys, "store.forget('srv:1')")
    with pytest.raises(KeyRefusedError, match="trust on first use is off"):
        store.check_server("srv:1", B, trust_on_first_use=False)


def test_an_in_place_same_size_rewrite_is_seen(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    store = KeyStore(keys)
    store.check_server("srv:1", A)
    _aged(store)
    store.check_server("srv:1", A)
    store.check_server("srv:1", A)
    assert store.known_reads == 1  # remembered
    path = keys / "known_servers"
    size = path.stat().st_size
    # another process overwrites the key in place: same inode, same size
    _in_other_process(
        keys,
        f"fd = __import__('os').open({str(path)!r}, __import__('os').O_WRONLY)\n"
        f"__import__('os').write(fd, b'srv:1 ' + {B.hex()!r}.encode() + b'\\n')\n",
    )
    assert path.stat().st_size == size
    with pytest.raises(KeyRefusedError, match="CHANGED"):
        store.check_server("srv:1", A)


def test_a_freshly_written_file_is_read_again_not_remembered(tmp_path: Path) -> None:
    """A file changed within the racy window is not remembered: a same-size rewrite in the same
    timestamp tick could not be told apart by its identity."""
    store = KeyStore(tmp_path)
    store.check_server("srv:1", A)
    reads = store.known_reads
    if time.time_ns() - os.lstat(tmp_path / "known_servers").st_ctime_ns >= keystore.RACY_WINDOW_NS:
        pytest.skip("the machine took longer than the racy window between two lines")
    store.check_server("srv:1", A)
    store.check_server("srv:1", A)
    assert store.known_reads == reads + 2


def test_a_remembered_file_made_group_readable_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    store.check_server("srv:1", A)
    _aged(store)
    store.check_server("srv:1", A)
    os.chmod(tmp_path / "keys" / "known_servers", 0o640)
    with pytest.raises(KeyStoreError, match="chmod 600"):
        store.check_server("srv:1", A)

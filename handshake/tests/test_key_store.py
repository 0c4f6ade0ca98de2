"""The key store: server key created 0600, trust on first use, changed keys refused, pinning."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from aeron_spark.handshake.crypto import public_bytes
from aeron_spark.handshake.errors import KeyRefusedError, KeyStoreError
from aeron_spark.handshake.keystore import KeyStore
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

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

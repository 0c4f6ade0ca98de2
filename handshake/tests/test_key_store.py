"""The key store: server key created 0600, trust on first use, changed keys refused, pinning."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
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

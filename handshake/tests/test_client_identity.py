"""Issue 19, item 1: each client has a static X25519 identity key in its key store, created on
first use with the server key's hardening, shown by ``aeron-spark keys show --client``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from aeron_spark.cli import main
from aeron_spark.handshake.crypto import public_bytes
from aeron_spark.handshake.errors import KeyStoreError
from aeron_spark.handshake.keystore import KeyStore, load_client_key


def test_client_key_is_created_once_0600_and_differs_from_the_server_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    key = store.client_private_key()
    assert public_bytes(store.client_private_key()) == public_bytes(key)
    assert stat.S_IMODE((tmp_path / "keys" / "client.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert public_bytes(store.server_private_key()) != public_bytes(key)


def test_client_key_file_with_loose_permissions_or_a_symlink_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys")
    store.client_private_key()
    path = tmp_path / "keys" / "client.key"
    os.chmod(path, 0o644)
    with pytest.raises(KeyStoreError, match="chmod 600"):
        store.client_private_key()
    with pytest.raises(KeyStoreError, match="chmod 600"):
        load_client_key(path)
    os.chmod(path, 0o600)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(KeyStoreError, match="symbolic link"):
        load_client_key(link)
    assert public_bytes(load_client_key(path)) == public_bytes(store.client_private_key())
    with pytest.raises(KeyStoreError, match="does not exist"):
        load_client_key(tmp_path / "missing.key")


def test_keys_show_client_prints_the_client_public_key(tmp_path: Path, capsys) -> None:
    assert main(["keys", "show", "--client", "--key-store", str(tmp_path / "k")]) == 0
    shown = capsys.readouterr().out.strip()
    assert shown == public_bytes(KeyStore(tmp_path / "k").client_private_key()).hex()
    assert main(["keys", "show", "--key-store", str(tmp_path / "k")]) == 0
    assert capsys.readouterr().out.strip() != shown  # the server key is another key


def test_an_unusable_key_store_gives_a_process_key_but_unsafe_files_are_refused(
    tmp_path: Path,
) -> None:
    from aeron_spark.handshake import Client, ClientConfig

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    unusable = Client(ClientConfig(key_store_dir=str(blocker / "keys")))
    other = Client(ClientConfig(key_store_dir=str(blocker / "other")))
    assert public_bytes(unusable.static_key) == public_bytes(other.static_key)  # one per process
    store = KeyStore(tmp_path / "loose")
    store.client_private_key()
    os.chmod(tmp_path / "loose" / "client.key", 0o644)
    with pytest.raises(KeyStoreError, match="chmod 600"):
        _ = Client(ClientConfig(key_store_dir=str(tmp_path / "loose"))).static_key

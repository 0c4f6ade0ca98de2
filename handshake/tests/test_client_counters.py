"""The handshake client's refusals are registry counters, counted for the process.

A connect that waited out its timeout for one of the process's handshake slots, and a wait for
the key store's lock given up, were plain attributes: ``_HandshakeSlots.slot_timeouts`` (of a
private object nobody reads) and ``KeyStore.lock_timeouts`` (of the key store of one
``Client``: the connector makes a ``Client`` for each connect, so the count went with it).
The project's rule is a registry counter for everything refused: both are ``CounterType.CLIENT``
counters of the process (``handshake_client_counters()``; a stream client's
``client_counters()`` shows them beside its own). Real UDP sockets, a real lock holder.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from aeron_spark.counters import REGISTRY, CounterType
from aeron_spark.handshake import Client, ClientConfig, HandshakeTimeoutError
from aeron_spark.handshake import client as handshake_client
from aeron_spark.handshake.client import MAX_CONCURRENT_HANDSHAKES, handshakes_under_way
from aeron_spark.handshake.errors import KeyStoreLockedError
from aeron_spark.transport import Driver, DriverConfig

from .conftest import wait_for
from .test_attack_key_store_lock import _hold_lock, _release


def _process_counts() -> dict[str, int]:
    for name in ("slot_timeouts", "key_store_lock_timeouts"):
        assert REGISTRY.is_declared(CounterType.CLIENT, name), (
            f"{name} is not a registry counter (CounterType.CLIENT): a plain attribute"
        )
    return handshake_client.handshake_client_counters()


def test_a_connect_that_waited_out_its_slot_is_a_registry_counter(
    tmp_path: Path, silent_endpoint: str
) -> None:
    driver = Driver(DriverConfig(write_counters_file=False)).start()
    keys = str(tmp_path / "keys")
    holders = Client(ClientConfig(key_store_dir=keys, timeout_s=8.0), driver=driver)
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            holders.connect(silent_endpoint).close()
        except BaseException as exc:  # noqa: BLE001 - read below
            errors.append(exc)

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(MAX_CONCURRENT_HANDSHAKES)]
    for t in threads:
        t.start()
    try:
        host, port = silent_endpoint.rsplit(":", 1)
        wait_for(
            lambda: handshakes_under_way(host, int(port)) == MAX_CONCURRENT_HANDSHAKES,
            timeout_s=15.0,
            what="every slot for the silent endpoint taken",
        )
        before = (
            REGISTRY.is_declared(CounterType.CLIENT, "slot_timeouts")
            and (handshake_client.handshake_client_counters()["slot_timeouts"])
        )
        late = Client(ClientConfig(key_store_dir=keys, timeout_s=0.5), driver=driver)
        with pytest.raises(HandshakeTimeoutError, match="no handshake slot"):
            late.connect(silent_endpoint)
        counts = _process_counts()
        assert counts["slot_timeouts"] == before + 1, counts
    finally:
        for t in threads:
            t.join(60.0)
        driver.close()
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == MAX_CONCURRENT_HANDSHAKES  # each timed out against the silent one


def test_a_wait_for_the_key_store_lock_given_up_is_a_registry_counter(
    tmp_path: Path, silent_endpoint: str, client_driver: Driver
) -> None:
    """Two connects, each with a ``Client`` of its own (as the connector makes them), fail on
    a lock another process holds: the process counted both."""
    keys = tmp_path / "keys"
    before = (
        REGISTRY.is_declared(CounterType.CLIENT, "key_store_lock_timeouts")
        and (handshake_client.handshake_client_counters()["key_store_lock_timeouts"])
    )
    holder = _hold_lock(keys)
    try:
        for _ in range(2):
            client = Client(
                ClientConfig(key_store_dir=str(keys), timeout_s=0.5), driver=client_driver
            )
            with pytest.raises(KeyStoreLockedError):
                client.connect(silent_endpoint)
    finally:
        _release(holder)
    counts = _process_counts()
    assert counts["key_store_lock_timeouts"] == before + 2, counts

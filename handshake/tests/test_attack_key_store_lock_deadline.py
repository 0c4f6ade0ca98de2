"""A connect's one deadline against a held key store lock after a wait for a handshake slot.

A connect's timeout bounds the whole connect, its wait for one of the process's 16 handshake
slots with a server included (README, Reconnects). A key store lock another process holds is
waited for "at most its own timeout" (README, Security model), but that wait had the whole
timeout from the moment it began: a connect that first waited for a slot (16 others to a
server that never answers) then read its client key with the store locked waited a whole
timeout more, nearly twice the one it was given, before KEY_STORE_LOCKED.

Real UDP sockets (a bound socket never read is the silent server), a real holder process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aeron_spark.handshake import Client
from aeron_spark.handshake.client import MAX_CONCURRENT_HANDSHAKES, handshakes_under_way
from aeron_spark.handshake.errors import HandshakeError, KeyStoreLockedError

from .conftest import wait_for
from .test_attack_handshake_slots import _start_silent
from .test_attack_key_store_lock import _hold_lock, _release

TIMEOUT_S = 6.0


def test_attack_a_connect_waits_for_the_key_store_lock_only_until_its_own_deadline(
    tmp_path: Path, silent_endpoint: str, make_client: Callable[..., Client]
) -> None:
    host, port = silent_endpoint.rsplit(":", 1)
    first = make_client(key_store_dir=str(tmp_path / "first-keys"), timeout_s=TIMEOUT_S)
    first.static_key  # noqa: B018 - read before the slots fill (no lock wait of theirs)
    errors: list[BaseException] = []
    threads = _start_silent(first, silent_endpoint, errors)
    keys = tmp_path / "late-keys"
    holder = None
    outcome: list[BaseException | str] = []
    try:
        wait_for(
            lambda: handshakes_under_way(host, int(port)) == MAX_CONCURRENT_HANDSHAKES,
            what="the silent server's 16 slots taken",
        )
        holder = _hold_lock(keys)  # its client key not read yet: the store locked
        late = make_client(key_store_dir=str(keys), timeout_s=TIMEOUT_S)

        def run() -> None:
            try:
                late.connect(silent_endpoint).close()
                outcome.append("connected")
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                outcome.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=run, name="late", daemon=True)
        thread.start()
        thread.join(4 * TIMEOUT_S + 30.0)
        took = time.monotonic() - started
        assert not thread.is_alive(), f"still connecting after {took:.1f} s"
        (result,) = outcome
        print(f"after {took:.1f} s: {result!r}")
        assert isinstance(result, (KeyStoreLockedError, HandshakeError)), result
        # main: ~2 * TIMEOUT_S; the margin is wide for a loaded machine's late wake-ups
        assert took < TIMEOUT_S + 4.0, (
            f"a connect with timeout_s={TIMEOUT_S} took {took:.1f} s: a slot's wait, then a "
            f"whole timeout more for the key store's lock ({result!r})"
        )
    finally:
        if holder is not None:
            _release(holder)
        for t in threads:
            t.join(4 * TIMEOUT_S + 30.0)
    assert len(errors) == MAX_CONCURRENT_HANDSHAKES  # the silent server's, all timed out


def test_a_connect_waiting_for_the_lock_goes_on_once_its_holder_is_killed(
    tmp_path: Path, make_server: Callable[..., object], make_client: Callable[..., Client]
) -> None:
    """The holder killed (SIGKILL: no unlock of its own) while a connect waits: ``flock`` goes
    with the process, the lock file stays behind (a stale file locks nothing) and the connect
    completes within its timeout, a few retries after the death, not at its deadline. Held on
    main: a guard."""
    import signal

    server: Any = make_server()
    keys = tmp_path / "client-keys"
    client = make_client(key_store_dir=str(keys), timeout_s=30.0)
    holder = _hold_lock(keys)
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            client.connect(server.endpoint).close()
            outcome.append("connected")
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    thread = threading.Thread(target=run, name="waiter", daemon=True)
    try:
        thread.start()
        time.sleep(0.5)  # the connect is waiting for the lock (nothing else can make it wait)
        assert not outcome, outcome
        killed = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        holder.wait(30.0)
        thread.join(40.0)
        took = time.monotonic() - killed
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30.0)
    assert outcome == ["connected"], outcome
    assert (keys / ".lock").exists()  # the stale file left by the killed holder
    print(f"connected {took:.2f} s after the holder was killed")
    assert took < 15.0, took  # its 30 s timeout not run out: the death freed the lock

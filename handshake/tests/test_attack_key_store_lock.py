"""Another process holds the key store's lock and does not let go: a connect keeps its timeout.

The key store's writers and first reads take an exclusive ``flock`` on ``.lock`` in its
directory. Any process of the user can hold it: another Spark task paused mid-write (a
profiler, ``SIGSTOP``, a GC pause), a stuck ``aeron-spark keys`` command, or a hostile one. The
wait was for good: a connect whose client key was not yet read (first connect of the process, or
the key rewritten) or whose server was not yet known hung past its timeout while holding one of
the process's handshake slots. Real files, a real holder process, a real server over UDP.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aeron_spark.handshake import Client
from aeron_spark.handshake.errors import KeyStoreError

HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or dies)
"""


def _hold_lock(directory: Path) -> subprocess.Popen[str]:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(30.0)


@pytest.mark.parametrize("what", ["client key", "server key"])
def test_attack_a_held_key_store_lock_does_not_hang_a_connect(
    tmp_path: Path, make_server, make_client: Callable[..., Client], what: str
) -> None:
    server = make_server()
    keys = tmp_path / "client-keys"
    client = make_client(key_store_dir=str(keys), timeout_s=3.0)
    if what == "server key":  # the client key read and remembered; the server not known yet
        client.static_key  # noqa: B018 - reads (creates) it before the lock is taken
    holder = _hold_lock(keys)
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            client.connect(server.endpoint).close()
            outcome.append("connected")
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, name="connect", daemon=True)
    thread.start()
    try:
        thread.join(30.0)
        took = time.monotonic() - started
        assert not thread.is_alive(), (
            f"a connect with a 3 s timeout still waited after {took:.0f} s for the key store's "
            f"lock another process holds ({what})"
        )
        (result,) = outcome
        print(f"{what}: after {took:.1f} s: {result!r}")
        assert isinstance(result, KeyStoreError), result
        assert "KEY_STORE_LOCKED" in str(result) and str(keys) in str(result)
        assert took < 3.0 + 10.0  # its own timeout, with a loaded machine's margin
    finally:
        _release(holder)
        thread.join(60.0)
    # the lock let go: the same client connects (nothing was left half done)
    client.connect(server.endpoint).close()


def test_a_held_key_store_lock_is_a_session_not_open_yet_for_the_connector(
    tmp_path: Path, make_server
) -> None:
    """The connector retries it (a reconnect attempts again until its deadline): the holder may
    let go, unlike a refusal (ServerUnavailableError, raised at once)."""
    from aeron_spark.connector.errors import SessionLostError
    from aeron_spark.connector.session.link import open_client_link
    from aeron_spark.connector.session.settings import ClientSettings

    server = make_server()
    keys = tmp_path / "connector-keys"
    settings = ClientSettings(endpoint=server.endpoint, key_store_dir=str(keys), timeout_s=2.0)
    holder = _hold_lock(keys)
    try:
        with pytest.raises(SessionLostError, match="KEY_STORE_LOCKED"):
            open_client_link(settings)
    finally:
        _release(holder)

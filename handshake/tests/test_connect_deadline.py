"""One deadline for a whole connect (the eighteenth session's closing note).

A process runs at most ``MAX_CONCURRENT_HANDSHAKES`` handshakes at once; the rest wait for a
slot. The wait used to be bounded by ``timeout_s`` and the handshake then ran with a full
``timeout_s`` of its own, so a connect could take twice its timeout. The slot's wait now comes
out of the handshake's deadline, and a connect that gets no slot in time fails with
``HANDSHAKE_TIMEOUT`` naming the slots.

Real parts: the slots are held by real handshakes towards a real UDP port that never answers
(a socket bound on loopback that nobody reads), so each holds its slot for its whole timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from aeron_spark.handshake import client as client_module
from aeron_spark.handshake.errors import ErrorCode, HandshakeTimeoutError

from .conftest import wait_for

HOLD_S = 3.0  # how long each of the 16 holders keeps its slot (its own timeout)


def _hold_every_slot(make_client: Any, endpoint: str) -> list[threading.Thread]:
    """Start MAX_CONCURRENT_HANDSHAKES connects to ``endpoint`` that each hold a slot HOLD_S."""
    holder = make_client(timeout_s=HOLD_S)
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            holder.connect(endpoint).close()
        except HandshakeTimeoutError as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=hold, daemon=True)
        for _ in range(client_module.MAX_CONCURRENT_HANDSHAKES)
    ]
    for thread in threads:
        thread.start()
    wait_for(
        lambda: client_module.handshakes_under_way() == client_module.MAX_CONCURRENT_HANDSHAKES,
        what="every handshake slot taken",
    )
    return threads


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()


def test_a_connect_that_waited_for_a_slot_ends_within_its_own_timeout(
    make_client: Any, silent_endpoint: str
) -> None:
    timeout_s = HOLD_S + 1.0  # it gets a slot after ~HOLD_S, with ~1 s of its timeout left
    threads = _hold_every_slot(make_client, silent_endpoint)
    late = make_client(timeout_s=timeout_s)
    started = time.monotonic()
    with pytest.raises(HandshakeTimeoutError):
        late.connect(silent_endpoint)
    took = time.monotonic() - started
    _join(threads)
    # main: the slot's wait (~HOLD_S) then a whole timeout_s of handshake: ~2 * HOLD_S + 1
    assert took < timeout_s + 1.5, (
        f"a connect with timeout_s={timeout_s} took {took:.2f} s (slot wait + a full timeout)"
    )


def test_a_connect_that_gets_no_slot_in_time_fails_naming_the_slots(
    make_client: Any, silent_endpoint: str
) -> None:
    threads = _hold_every_slot(make_client, silent_endpoint)
    late = make_client(timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(HandshakeTimeoutError) as caught:
        late.connect(silent_endpoint)
    took = time.monotonic() - started
    _join(threads)
    assert caught.value.code is ErrorCode.HANDSHAKE_TIMEOUT
    assert "no handshake slot" in str(caught.value), str(caught.value)
    assert took < HOLD_S, f"waited {took:.2f} s for a slot (holders keep theirs {HOLD_S} s)"

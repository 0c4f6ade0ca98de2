"""A wait for a handshake slot interrupted by an exception gives back what it took.

``_HandshakeSlots.acquire`` counted its caller as a user of the endpoint's slots, then waited on
the endpoint's semaphore: an exception raised inside the wait (a signal handler's, as Ctrl-C's
``KeyboardInterrupt``) left the user counted for good, so the endpoint's entry was never
removed (one kept per endpoint ever interrupted) and, raised just after the semaphore was
taken, a slot of the endpoint's few was lost for the process's life. Now whatever was taken is
given back on any exception. A real ``SIGALRM`` whose handler raises, during a real wait."""

from __future__ import annotations

import signal

import pytest

from aeron_spark.handshake.client import MAX_CONCURRENT_HANDSHAKES, _HandshakeSlots


class _Interrupted(Exception):
    pass


def _raise(signum: int, frame: object) -> None:
    raise _Interrupted


def test_a_wait_for_a_slot_interrupted_by_a_signal_takes_nothing() -> None:
    slots = _HandshakeSlots()
    key = ("127.0.0.1", 40123)
    for _ in range(MAX_CONCURRENT_HANDSHAKES):  # every slot held: the next connect waits
        assert slots.acquire(key, 1.0)
    previous = signal.signal(signal.SIGALRM, _raise)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupted):
            slots.acquire(key, 60.0)  # interrupted in its wait, well before its timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    for _ in range(MAX_CONCURRENT_HANDSHAKES):
        slots.release(key)
    # every holder and waiter gone: the endpoint's entry goes (on main: its interrupted
    # waiter stayed counted, and the entry with it)
    assert slots._slots == {}, slots._slots
    assert slots.under_way() == 0
    # and every slot is there for the next connects
    for _ in range(MAX_CONCURRENT_HANDSHAKES):
        assert slots.acquire(key, 1.0)
    assert not slots.acquire(key, 0.0)

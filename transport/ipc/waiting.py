"""How an IPC waiter waits: the other side is another process, so nothing can wake it; it polls
in a back-off whose delays the sans-I/O :class:`~aeron_spark.transport.protocol.ipc.Backoff`
decides (this shell only reads the clock and sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable

from aeron_spark.transport.client import WaitKind
from aeron_spark.transport.protocol.ipc import (
    CONNECT_BACKOFF_NS,
    DATA_BACKOFF_NS,
    LIMIT_BACKOFF_NS,
    Backoff,
)

_BACKOFFS: dict[WaitKind, tuple[int, int]] = {
    "limit": LIMIT_BACKOFF_NS,
    "connect": CONNECT_BACKOFF_NS,
    "data": DATA_BACKOFF_NS,
}


class BackoffSignal:
    """Polls ``ready()`` in a back-off; ``step(now_ns)`` (a subscription's scan) runs before each
    poll, so waiting works without a driver thread too."""

    __slots__ = ("_step",)

    def __init__(self, step: Callable[[int], object] | None = None) -> None:
        self._step = step

    def notify(self) -> None:
        """Nothing to do: waiters poll (what they wait for is in another process's hands)."""

    def wait_until(self, ready: Callable[[], bool], deadline: float, kind: WaitKind) -> bool:
        backoff = Backoff(*_BACKOFFS[kind])
        deadline_ns = int(deadline * 1e9)
        step = self._step
        while True:
            if step is not None:
                step(time.monotonic_ns())
            if ready():
                return True
            delay_ns = backoff.next_delay_ns(time.monotonic_ns(), deadline_ns)
            if delay_ns <= 0:
                return ready()
            time.sleep(delay_ns / 1e9)


__all__ = ["BackoffSignal"]

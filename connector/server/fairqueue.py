"""Deferred jobs taken from their clients in turn (the commit worker's queue).

The server runs its deferred operations (commit, abort, scan, ...: ``requests.DEFERRED_OPS``)
on one worker thread. In arrival order, a client with many sessions, each with its
``MAX_DEFERRED_PER_SESSION`` requests queued, put every other client's commit behind all of
them; taken in turn, another client waits behind at most one job of each client with jobs
queued. Sans-I/O: the caller runs what :meth:`FairQueue.take` gives.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any


class FairQueue:
    """Jobs per client, FIFO within a client, round robin across clients. Thread-safe (put on
    the loop's thread, take on the worker's)."""

    def __init__(self) -> None:
        self._queues: collections.OrderedDict[str, collections.deque[Callable[[], Any]]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def put(self, client: str, job: Callable[[], Any]) -> None:
        with self._lock:
            queue = self._queues.get(client)
            if queue is None:
                queue = self._queues[client] = collections.deque()
            queue.append(job)

    def take(self) -> Callable[[], Any] | None:
        """The next client's oldest job (that client then goes last); None when empty."""
        with self._lock:
            if not self._queues:
                return None
            client, queue = next(iter(self._queues.items()))
            job = queue.popleft()
            if queue:
                self._queues.move_to_end(client)
            else:
                del self._queues[client]
            return job

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._queues.values()))


__all__ = ["FairQueue"]

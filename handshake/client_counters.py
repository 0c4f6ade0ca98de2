"""The handshake client's counts for the whole process: connects refused before a datagram.

Registry counters of ``CounterType.CLIENT`` (a stream client's ``client_counters()`` shows them
beside its own). Counted for the process, not per :class:`~.client.Client`: the slots are the
process's, and the connector makes a ``Client`` (and its key store) for each connect.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from aeron_spark.counters import REGISTRY, CounterType, counter_set


def _described(text: str) -> int:
    return field(default=0, metadata={"description": text})  # type: ignore[no-any-return]


@counter_set(CounterType.CLIENT)
@dataclass(slots=True)
class HandshakeClientCounters:
    """This process's handshake client counts (all kept, never reset)."""

    # connects that waited out their timeout for one of the process's handshake slots with
    # their server (HANDSHAKE_TIMEOUT, no datagram sent)
    slot_timeouts: int = _described("connects that waited out their timeout for a handshake slot")
    # waits for a key store's lock given up (KEY_STORE_LOCKED: another process held it)
    key_store_lock_timeouts: int = _described("waits for a key store's lock given up")


COUNTERS = HandshakeClientCounters()
_lock = threading.Lock()  # the counts are bumped from any connecting thread


def count(name: str) -> None:
    """One more ``name`` (a field of :class:`HandshakeClientCounters`)."""
    with _lock:
        setattr(COUNTERS, name, getattr(COUNTERS, name) + 1)


def handshake_client_counters() -> dict[str, int]:
    """The process's handshake client counters by name (``CounterType.CLIENT``)."""
    with _lock:
        return REGISTRY.snapshot(CounterType.CLIENT, COUNTERS)


__all__ = ["COUNTERS", "HandshakeClientCounters", "count", "handshake_client_counters"]

"""What an Aeron Archive does not keep, for the sessions of the archive store and of a set of
replicas alike: no time per message (no time index), no message boundaries in its catalog (the
reader scans), no pushed filters, no consumer positions (options refuse what needs them first)."""

from __future__ import annotations

from typing import Any

from aeron_spark.connector.pushdown import Pushed
from aeron_spark.connector.stores import Recording, no_hook


class ArchiveHooks:
    """The optional hooks of a store session that an archive has not (a base of its sessions,
    which have a ``store``)."""

    __slots__ = ()
    store: Any

    def position_at(self, rec: Recording, timestamp_ns: int) -> int:
        raise no_hook(self.store, "time index")

    def message_ends(self, recs: list[Recording]) -> dict[str, int] | None:
        return None  # an archive keeps no message boundaries: the reader scans

    def narrow(self, pushed: Pushed, rec: Recording, start: int, end: int) -> tuple[int, int]:
        raise no_hook(self.store, "filter pushdown")

    def commit_consumer(
        self, consumer_id: str, stream_ids: tuple[int, ...], positions: dict[str, int]
    ) -> None:
        raise no_hook(self.store, "consumer positions")

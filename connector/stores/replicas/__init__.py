"""A set of Aeron Archive replicas as one log store (:mod:`.source`): ``archive`` naming
several control channels, read through the archive store with failover."""

from aeron_spark.connector.stores.replicas.source import (
    ReplicaRange,
    ReplicaSession,
    ReplicaStore,
    identity_key,
    in_sync_end,
)

__all__ = ["ReplicaRange", "ReplicaSession", "ReplicaStore", "identity_key", "in_sync_end"]

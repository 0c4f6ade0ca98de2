"""The stream server as a log store: reading (:mod:`.source`) and the exactly-once sink's
stage/commit/abort (:mod:`.sink`)."""

from aeron_spark.connector.stores.server.source import ServerRange, ServerSession, ServerStore

__all__ = ["ServerRange", "ServerSession", "ServerStore"]

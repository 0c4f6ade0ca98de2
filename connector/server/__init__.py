"""The stream server: records streams, serves replays by position, commits sink batches.

Embedded: ``with StreamServer(ServerConfig(directory=...)) as server: server.endpoint``.
Command line: ``aeron-spark server`` (:func:`server_main`) and ``aeron-spark stat``
(:func:`stat_main`).
"""

from __future__ import annotations

from typing import Any

from aeron_spark.connector.server.cli import server_main
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.stat import stat_main


def __getattr__(name: str) -> Any:  # StreamServer pulls in the transport: import it lazily
    if name == "StreamServer":
        from aeron_spark.connector.server.server import StreamServer

        return StreamServer
    raise AttributeError(name)


def main(argv: list[str]) -> int:
    """``aeron_spark.connector.server.main(argv)``: ``server ...`` or ``stat ...``."""
    if argv and argv[0] == "stat":
        return stat_main(argv[1:])
    if argv and argv[0] == "server":
        argv = argv[1:]
    return server_main(argv)


__all__ = ["ServerConfig", "StreamServer", "main", "server_main", "stat_main"]

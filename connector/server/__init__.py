"""The stream server: records streams, serves replays by position, commits sink batches.

Embedded::

    from aeron_spark.connector.server import ServerConfig, StreamServer
    with StreamServer(ServerConfig(directory="/data/aeron", port=0)) as server:
        print(server.endpoint)          # "127.0.0.1:<bound port>"

Command line: ``aeron-spark server --dir DIR --port PORT [--host H] [--ingest-channel URI]
[--ingest-stream-id N ...] [--no-encryption] [--key-store DIR] [--fsync] [--read-only]
[--no-purge] [--no-local-reads] [--no-local-writes]`` (:func:`server_main`) and ``aeron-spark
stat [--dir DIR | --endpoint H:P] [--once [--json]]`` (:func:`stat_main`).

Modules: ``config`` (ServerConfig), ``core`` (sans-I/O request handling), ``server`` (the event
loop), ``link`` (sessions: handshake connections, sealed with AES-GCM), ``store`` (recordings,
replays, publishers, ingest, sink writers), ``recordings`` (segment files, index, purge, crash
recovery), ``framing`` (payloads -> Aeron frames), ``staging`` + ``commitlog`` (exactly-once sink
commits), ``stat``, ``cli``, ``testing`` (helpers for tests and benchmarks).

Wire protocol on a session: see :mod:`aeron_spark.connector.session.protocol` (control messages
and replay data) and :mod:`aeron_spark.connector.session.chunking` (messages above the
transport's limit).
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

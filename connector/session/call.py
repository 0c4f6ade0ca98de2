"""One request and its reply on a session of its own (``aeron-spark stat --endpoint``).

The full client (:class:`~aeron_spark.connector.client.StreamClient`) pipelines requests, runs
replays and keeps the session alive; a tool that asks one question needs none of that, and the
server side must not import the client, so this is the whole exchange over the session layer:
send the request (chunked when it is above the link's limit), read until the reply with its id
arrives (reassembling a chunked one), raise the typed error the server reported.
"""

from __future__ import annotations

import time
from typing import Any

from aeron_spark.connector.errors import ServerUnavailableError, error_from_wire
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto
from aeron_spark.connector.session.link import open_client_link
from aeron_spark.connector.session.settings import ClientSettings

_REQUEST_ID = 1


def call_once(settings: ClientSettings, op: str, args: dict[str, Any] | None = None) -> Any:
    """Open a session, send ``op`` with ``args``, return its result and close the session.

    Every wait is bounded by ``settings.timeout_s``; a server that does not answer raises
    :class:`~aeron_spark.connector.errors.ServerUnavailableError`.
    """
    link = open_client_link(settings)
    try:
        deadline = time.monotonic() + settings.timeout_s
        message = proto.encode_request(_REQUEST_ID, op, dict(args or {}))
        if len(message) <= link.max_message_length:
            link.send(message, deadline)
        else:
            for chunk in chunking.split(message, link.max_message_length, 1):
                link.send(chunk, deadline)
        reassembler = chunking.Reassembler()
        while True:
            received: bytes | bytearray | None = link.receive(deadline)
            if received is None:
                if not link.is_connected:
                    raise ServerUnavailableError(
                        f"the session to {settings.endpoint} was closed by the server or lost"
                    )
                if time.monotonic() >= deadline:
                    raise ServerUnavailableError(
                        f"no reply from {settings.endpoint} within {settings.timeout_s} s"
                    )
                continue
            if chunking.is_chunk(received):
                whole = reassembler.feed(received, time.monotonic_ns())
                if whole is None:
                    continue
                received = whole
            if len(received) and received[0] != proto.KIND_CONTROL:
                continue  # replay data: not ours (we started no replay)
            reply = proto.decode_reply(received)
            if reply.id not in (_REQUEST_ID, 0) or reply.event is not None:
                continue
            if not reply.ok:
                raise error_from_wire(reply.error)
            if reply.id == _REQUEST_ID:
                return reply.result
    finally:
        link.close()


__all__ = ["call_once"]

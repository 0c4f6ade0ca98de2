"""Attack: one client fills ``--max-incomplete-bytes`` for everyone.

What incomplete chunked messages may hold (``--max-incomplete-bytes``, 256 MiB) was one budget
for all sessions together, bounded per session (``--max-incomplete-bytes-per-session``, 32 MiB)
but not per client: one authorised client opening eight sessions (``--max-per-key`` lets a key
hold 2,048) and keeping a message incomplete in each (renewed every 30 s) held all of it, and
every other client's message larger than a session's transport message (a Spark sink task's
2 MiB stage request is one) was refused with ``LIMIT_EXCEEDED``. Fixed: a client's sessions
together hold at most ``--max-incomplete-bytes-per-client`` (half of the total by default; its
key with ``--authorized-keys``, else its address): past it a chunk is refused naming that
option, and the other half stays for the others.

A real server process with ``--authorized-keys``, real sessions over loopback UDP."""

from __future__ import annotations

from pathlib import Path

from aeron_spark.connector.errors import ErrorCode
from aeron_spark.connector.server.testing import keyed_server
from aeron_spark.connector.session import chunking
from connector.tests.test_server_memory import MIB, _header, _ping, _send


def test_attack_one_key_cannot_hold_every_incomplete_byte(tmp_path: Path) -> None:
    grants = {"hostile": "read=* write=*", "victim": "read=* write=*", "ops": "read=* admin"}
    extra = ["--max-incomplete-bytes", "8M", "--max-incomplete-bytes-per-session", "4M"]
    with keyed_server(str(tmp_path), grants, extra) as server:
        hostile = [server.client("hostile") for _ in range(3)]
        try:
            piece = hostile[0].max_message_length - chunking.CHUNK_HEADER_LENGTH
            total = 4 * MIB
            count = -(-total // piece)
            held = (7 * MIB // 2) // piece  # chunks making about 3.5 MiB of a 4 MiB message
            refusals = []  # each session's first refusal (its later chunks then have no message)
            for n, c in enumerate(hostile):
                for index in range(held):
                    _send(c, _header(total, count, b"h" * piece, pid=n + 1, index=index))
                refusals += [r for r in _ping(c, 1) if not r.ok][:1]
            # another key's 3 MiB message (chunked) still goes through (on main: LIMIT_EXCEEDED,
            # the hostile key held 7 MiB of the 8 in two sessions)
            with server.client("victim") as victim:
                payload = b"v" * (3 * MIB)
                assert victim.publish(10, [payload]) > 3 * MIB
            # the hostile key's second and third sessions' chunks past its 4 MiB share: refused
            assert [r.error["code"] for r in refusals] == [int(ErrorCode.LIMIT_EXCEEDED)] * 2
            assert "--max-incomplete-bytes-per-client" in refusals[0].error["message"], refusals
            # counted as refusals, and as refusals for a client's share (its own counter: on
            # main only incomplete_messages_refused, the same as for the server's whole budget)
            with server.client("ops") as ops:
                counters = ops.stats()["counters"]
            assert counters["incomplete_messages_refused"] == 2, counters
            assert counters["incomplete_messages_over_share"] == 2, counters
        finally:
            for c in hostile:
                c.close()

"""Attack on issue 28 item 2's fix (README "Memory a client can make the server hold"): an
incomplete chunked message's deadline is renewed by every chunk, however small, so a client that
trickles one 1-byte chunk per second keeps up to ``--max-incomplete-bytes-per-session`` held for
as long as it likes; a few sessions of one client (read permission is enough: chunks are
reassembled before any permission check) so hold the whole server-wide budget, and every other
client's chunked ``publish``/``stage`` is refused with ``LIMIT_EXCEEDED`` for as long as the
trickle goes on. The timeout bounds only the gap between chunks, not the life of a message.

Cause: ``connector/session/chunking.py`` ``Reassembler.feed`` sets
``self._deadline_ns = now_ns + self.timeout_ns`` on every accepted chunk, with no minimum chunk
size, no bound on the message's age, and no per-client (per key) share of the
``ReassemblyBudget``. Fixed: the deadline is set by a message's first chunk, not renewed."""

from __future__ import annotations

import time

from aeron_spark.connector.errors import ErrorCode, LimitExceededError
from aeron_spark.connector.server.testing import client_for
from aeron_spark.connector.session import chunking

from .test_server_memory import MIB, TIMEOUT_S, _chunk_holders, _counters, _header, _ping, _send


def test_trickled_chunks_cannot_hold_the_incomplete_budget_past_the_timeout(tmp_path) -> None:
    with _chunk_holders(tmp_path, 2) as (endpoint, holders):
        piece = holders[0].max_message_length - chunking.CHUNK_HEADER_LENGTH
        total = 4 * MIB
        count = 1 << 30  # as many chunks as the sender likes: 1-byte ones after the bulk
        bulk = (7 * MIB // 2) // piece  # 3 chunks, about 3 MiB held per session (6 of the 8 MiB)
        for n, c in enumerate(holders):
            for index in range(bulk):
                _send(c, _header(total, count, b"h" * piece, pid=n + 1, index=index))
            assert all(r.ok for r in _ping(c, 1))
        # trickle: one 1-byte chunk per session every 0.5 s, for 3x the 2 s timeout
        index = bulk
        started = time.monotonic()
        while time.monotonic() - started < 6.0:
            for n, c in enumerate(holders):
                _send(c, _header(total, count, b"t", pid=n + 1, index=index))
            index += 1
            time.sleep(0.5)
        for c in holders:
            _ping(c, 2)  # drain: chunks after the expiry are refused (no open payload)
        counters = _counters(endpoint)
        assert counters["incomplete_messages_expired"] >= 1, counters
        # the promise: a message older than the timeout is discarded on the clock
        with client_for(endpoint, timeout_s=TIMEOUT_S) as honest:
            payload = b"p" * (3 * MIB)
            try:
                honest.publish(10, [payload])
            except LimitExceededError as exc:
                assert exc.code == ErrorCode.LIMIT_EXCEEDED
                raise AssertionError(
                    f"an honest 3 MiB publish was refused after {index - bulk} 1-byte "
                    f"chunks per session kept 2 x {bulk * piece} bytes held for 6 s "
                    f"past a 2 s timeout "
                    f"(incomplete_messages_expired="
                    f"{counters['incomplete_messages_expired']}): {exc}"
                ) from exc

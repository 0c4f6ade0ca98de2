"""A replay nobody reads does not pile up in the client while it makes other calls.

Before: every message of the session is read by whichever call waits on it, and a replay's
blocks were queued for its iterator whatever their number, so an application that started a
replay, took one block and then made other calls on the same client (listings, stats) held the
whole replay in memory (48 MiB here, without bound for a live replay). Now a replay's queue
holds at most ``ClientSettings.max_queued_replay_bytes`` (32 MiB by default): past it the blocks
are dropped and the replay stopped (``replay_overruns``), and the iterator asks the server again
from the last block it delivered when it is read next, so every block still comes exactly once.
Over a real server process.
"""

from __future__ import annotations

import time

import pytest

from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.connector.session.settings import ClientSettings

STREAM = 10
MESSAGE = bytes(range(256)) * 256  # 64 KiB
TOTAL = 48 * 1024 * 1024  # more than the default bound
WAIT_S = 120.0  # bounded wait for the replay to be queued or overrun (a loaded machine)


def _queued(client) -> int:
    """The replay bytes the client holds for iterators nobody is reading."""
    return sum(
        len(item.data)
        for queue in client._replay_queues.values()
        for item in queue
        if isinstance(item, ReplayBlock)
    )


@pytest.mark.slow
def test_an_unread_replay_stays_bounded_while_other_calls_run_and_then_completes(
    tmp_path,
) -> None:
    # (the code before had no bound: the default's value, to measure it against)
    limit = getattr(ClientSettings(), "max_queued_replay_bytes", 32 * 1024 * 1024)
    assert limit < TOTAL
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        with client_for(endpoint, timeout_s=60.0) as client:
            end = client.publish(STREAM, [MESSAGE] * (TOTAL // len(MESSAGE)))
            (rec,) = client.list_recordings([STREAM])
            blocks = client.replay(rec.recording_id, 0, end)
            first = next(blocks)
            biggest = len(first.data)
            peak = 0
            deadline = time.monotonic() + WAIT_S
            while getattr(client, "replay_overruns", 0) == 0:
                client.list_streams()  # another call: it reads the replay's blocks too
                queued = _queued(client)
                peak = max(peak, queued)
                if queued >= end - first.end_position - biggest:
                    break  # (the code before: the whole replay queued)
                assert time.monotonic() < deadline, f"{queued} bytes queued, no overrun"
            # the rest, read now: exactly once, in order, up to the end
            position = first.end_position
            for block in blocks:
                assert block.position == position
                position = block.end_position
                biggest = max(biggest, len(block.data))
            assert position == end
            overruns = getattr(client, "replay_overruns", 0)
    assert peak <= limit + biggest, f"{peak} bytes of an unread replay queued (bound {limit})"
    assert overruns >= 1

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

from aeron_spark.connector.client import StreamClient
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


def _small_bound_client(endpoint: str, limit: int) -> StreamClient:
    settings = ClientSettings(
        endpoint=endpoint, encryption=False, timeout_s=60.0, max_queued_replay_bytes=limit
    )
    return StreamClient.connect(settings)


@pytest.mark.slow
def test_a_replay_overrun_before_its_first_block_was_read_is_asked_again(tmp_path) -> None:
    """A replay started (the request is eager) and left unread while other calls run overruns
    before its iterator took anything. Before: its first ``next`` raised ``KeyError`` (its
    queue was gone); now it asks again from the start and gets every block once, in order."""
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        with _small_bound_client(endpoint, 1024 * 1024) as client:
            end = client.publish(STREAM, [MESSAGE] * 64)  # 4 MiB
            (rec,) = client.list_recordings([STREAM])
            blocks = client.replay(rec.recording_id, 0, end)
            deadline = time.monotonic() + WAIT_S
            while client.replay_overruns == 0:
                client.list_streams()  # another call: it reads the replay's blocks too
                assert time.monotonic() < deadline, f"{_queued(client)} bytes queued"
            position = 0
            for block in blocks:
                assert block.position == position
                position = block.end_position
            assert position == end


@pytest.mark.slow
def test_several_unread_replays_of_one_client_stay_within_one_bound_together(tmp_path) -> None:
    """Six replays of one client, each of 3 MiB (under the 4 MiB bound), started and left
    unread while other calls run. Before: the bound was per replay, so none overran and the
    client held them all (18 MiB; a server runs up to 16 replays a session, each up to the
    bound: 512 MiB by default). Now the bound is the client's, all its replays together, and
    each replay read to its end afterwards still gets every block once, in order."""
    limit = 4 * 1024 * 1024
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        with _small_bound_client(endpoint, limit) as client:
            end = client.publish(STREAM, [MESSAGE] * 48)  # 3 MiB and headers
            (rec,) = client.list_recordings([STREAM])
            replays = [client.replay(rec.recording_id, 0, end) for _ in range(6)]
            peak = _queued(client)
            deadline = time.monotonic() + WAIT_S

            def all_sent() -> bool:  # each replay overrun (queue gone) or its end queued
                queues = client._replay_queues.values()
                return all(q and not isinstance(q[-1], ReplayBlock) for q in queues)

            while not all_sent():
                client.list_streams()  # another call: it reads the replays' blocks too
                peak = max(peak, _queued(client))
                assert time.monotonic() < deadline, f"{_queued(client)} bytes queued"
            biggest = 0
            for blocks in replays:
                position = 0
                for block in blocks:
                    assert block.position == position
                    position = block.end_position
                    biggest = max(biggest, len(block.data))
                assert position == end
    assert peak <= limit + biggest, f"{peak} bytes of unread replays queued (bound {limit})"


@pytest.mark.slow
def test_replays_read_in_turn_under_the_smallest_bound_each_move_on(tmp_path) -> None:
    """Three replays of 3 MiB read a block each in turn, with the smallest bound (64 KiB, less
    than one block): while one is read the others' blocks pass the bound and they overrun,
    again and again. Each overrun is asked again and the replay being read always takes the
    block it waits for, so every read moves on: no overrun loop without progress, every block
    once, in order."""
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        with _small_bound_client(endpoint, 64 * 1024) as client:
            end = client.publish(STREAM, [MESSAGE] * 48)
            (rec,) = client.list_recordings([STREAM])
            replays = [client.replay(rec.recording_id, 0, end) for _ in range(3)]
            positions = [0, 0, 0]
            delivered = 0
            while any(p < end for p in positions):
                for i, blocks in enumerate(replays):
                    if positions[i] < end:
                        block = next(blocks)
                        assert block.position == positions[i]
                        positions[i] = block.end_position
                        delivered += 1
            for blocks in replays:
                assert next(blocks, None) is None
            overruns = client.replay_overruns
    assert overruns >= 1
    assert overruns <= delivered + len(replays), (overruns, delivered)

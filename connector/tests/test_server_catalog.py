"""The server's catalog work is proportional to what changed or was asked (issue 31 item 4: the
``stat.json`` snapshot re-encoded the whole catalog every second on the loop, 3.1 MB at 10,000
recordings, and every listing sorted and copied every recording)."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.server.testing import (
    client_for,
    stat_snapshot_after,
    write_session_recordings,
)
from aeron_spark.transport.archive import Recording

TERM = 64 * 1024


def test_the_stat_snapshot_rereads_only_recordings_that_can_change(tmp_path: Path) -> None:
    directory = str(tmp_path / "srv")
    write_session_recordings(directory, 200, 3, lambda n: 6 if n % 10 == 0 else 5)
    config = ServerConfig(directory=directory, port=0, term_length=TERM, mtu=1408)
    with StreamServer(config) as server:
        assert server.core is not None
        catalog = server.core.store.catalog  # type: ignore[attr-defined]
        first = stat_snapshot_after(directory, time.time())
        assert len(first["recordings"]) == 200
        assert first["streams"] == server.snapshot()["streams"]
        assert [s["recordings"] for s in first["streams"]] == [180, 20]
        # every recording was read once (all stopped): the next snapshots read none of them
        settled = catalog.refreshed
        stat_snapshot_after(directory, time.time())
        stat_snapshot_after(directory, time.time())
        assert catalog.refreshed == settled
        with client_for(server.endpoint) as client:
            mark = catalog.refreshed
            client.publish(6, [b"new"] * 10)  # one live recording
            big = client.list_recordings([5])
            assert len(big) == 180 and [r.recording_id for r in big] == sorted(
                r.recording_id for r in big
            )
            small = client.list_recordings([6])
            assert len(small) == 21
            live = small[-1]
            purged = client.scan(small[0].recording_id, 0, max_messages=1).end
            assert client.purge(small[0].recording_id, purged) == purged
            snapshot = stat_snapshot_after(directory, time.time())
            # the live recording (once per snapshot, a few written meanwhile) and the purged
            # one: never the other 199
            assert 2 <= catalog.refreshed - mark <= 8
            full = server.snapshot()
            assert snapshot["recordings"] == full["recordings"]
            assert snapshot["streams"] == full["streams"]
            by_id = {r["recording_id"]: r for r in snapshot["recordings"]}
            assert by_id[live.recording_id]["recorded_position"] == live.recorded_position
            assert by_id[small[0].recording_id]["purged_position"] == purged


def test_list_streams_and_the_stop_retry_walk_what_changed_not_every_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_streams`` described every recording (an ``_info`` each) and the loop's
    housekeeping tried every recording's stop file every second (issue 31 item 4): both now
    touch only what may have changed (the live recordings, the stops still pending)."""
    described = collections.Counter[str]()
    info, persist = ArchiveStore._info, Recording.persist_stop

    def counted_info(self: ArchiveStore, rec: Recording) -> dict:
        described["info"] += 1
        return info(self, rec)

    def counted_persist(self: Recording) -> bool:
        described["persist_stop"] += 1
        return persist(self)

    monkeypatch.setattr(ArchiveStore, "_info", counted_info)
    monkeypatch.setattr(Recording, "persist_stop", counted_persist)
    directory = str(tmp_path / "srv")
    write_session_recordings(directory, 200, 3, lambda n: 6 if n % 10 == 0 else 5)
    config = ServerConfig(directory=directory, port=0, term_length=TERM, mtu=1408)
    with StreamServer(config) as server, client_for(server.endpoint) as client:
        stat_snapshot_after(directory, time.time())  # every recording described once
        streams = client.list_streams()
        assert [(s["stream_id"], s["recordings"], s["active_recordings"]) for s in streams] == [
            (5, 180, 0),
            (6, 20, 0),
        ]
        described.clear()
        for _ in range(3):
            assert client.list_streams() == streams
        stat_snapshot_after(directory, time.time())  # a second of housekeeping at least
        stat_snapshot_after(directory, time.time())
        assert described["info"] == 0, described
        assert described["persist_stop"] == 0, described
        client.publish(6, [b"new"] * 10)  # one live recording: described, the others not
        described.clear()
        now = {s["stream_id"]: s for s in client.list_streams()}
        assert (now[6]["recordings"], now[6]["active_recordings"]) == (21, 1)
        assert now[6]["bytes"] > streams[1]["bytes"] and now[5] == streams[0]
        assert described["info"] <= 10, described  # the live one, a few times: not 200


def test_the_stat_snapshot_rereads_live_recordings_a_bounded_part_a_pass(tmp_path: Path) -> None:
    """Issue 31 (publish tail): with every session publishing, every recording is live and
    the snapshot's refresh re-read them all in one pass of the loop (~40 ms at 2,048, every
    publish behind it). It now re-reads at most ``STAT_REFRESH_PER_PASS`` a pass, and the
    snapshot still lists and counts every recording, as of one state."""
    from aeron_spark.connector.server.server import STAT_REFRESH_PER_PASS

    live = STAT_REFRESH_PER_PASS * 2 + 44  # three parts
    directory = str(tmp_path / "srv")
    config = ServerConfig(directory=directory, port=0, term_length=TERM, mtu=1408)
    with StreamServer(config) as server, client_for(server.endpoint) as client:
        assert server.core is not None
        catalog = server.core.store.catalog  # type: ignore[attr-defined]
        per_pass: list[int] = []
        step = server._stat_step

        def counted(now_ns: int) -> bool:  # what one pass of the loop re-reads
            mark = catalog.refreshed
            try:
                return step(now_ns)
            finally:
                per_pass.append(catalog.refreshed - mark)

        server._stat_step = counted  # type: ignore[method-assign]
        for stream in range(100, 100 + live):
            client.publish(stream, [b"x"])  # a live recording each
        stat_snapshot_after(directory, time.time())  # its refresh may have begun before
        first = stat_snapshot_after(directory, time.time())
        mark = len(per_pass)
        client.publish(100, [b"y"])
        stat_snapshot_after(directory, time.time())  # its refresh may have begun before
        snapshot = stat_snapshot_after(directory, time.time())
        assert len(first["recordings"]) == live
        assert len(snapshot["recordings"]) == live
        assert sum(s["recordings"] for s in snapshot["streams"]) == live
        assert snapshot["store"]["recordings"] == live
        by_id = {r["stream_id"]: r for r in snapshot["recordings"]}
        assert by_id[100]["recorded_position"] > by_id[101]["recorded_position"]
        # a whole refresh (every live recording) happened since, in parts
        assert sum(per_pass[mark:]) >= live
    # main: one pass re-read all of them
    assert max(per_pass) <= STAT_REFRESH_PER_PASS, max(per_pass)

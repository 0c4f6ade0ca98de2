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

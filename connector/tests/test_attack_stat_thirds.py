"""Attacks on the stat snapshot taken a third a loop pass (fifteenth session: catalog refresh,
then the snapshot, then the encode and write, sessions served between them), against a real
server process: a client creating recordings all the while (each publish to a new stream makes
one) must never make a snapshot whose ``streams`` section counts recordings its ``recordings``
section does not list, nor its store total disagree with them."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

from aeron_spark.connector.server.stat import read_snapshot
from aeron_spark.connector.server.testing import client_for, server_process


def _disagreement(snapshot: dict[str, Any]) -> str | None:
    counted = {s["stream_id"]: s["recordings"] for s in snapshot.get("streams", ())}
    listed = dict(collections.Counter(r["stream_id"] for r in snapshot.get("recordings", ())))
    total = snapshot.get("store", {}).get("recordings")
    if counted != listed or (total is not None and total != len(snapshot["recordings"])):
        differ = {s: (counted.get(s), listed.get(s)) for s in counted.keys() | listed.keys()}
        differ = {s: pair for s, pair in differ.items() if pair[0] != pair[1]}
        return (
            f"(streams count, recordings listed) differ for {differ}; store total {total}, "
            f"{len(snapshot['recordings'])} listed"
        )
    return None


def test_recordings_created_between_the_snapshots_thirds_are_counted_and_listed_together(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "srv")
    seen: set[Any] = set()
    bad: list[str] = []
    with server_process(directory) as (_proc, endpoint), client_for(endpoint) as client:
        stream = 100
        deadline = time.monotonic() + 120
        # until 10 snapshots were read while recordings were being made (each a second apart)
        while len(seen) < 10 and time.monotonic() < deadline:
            for _ in range(10):
                client.publish(stream, [b"x"])  # a new stream: a new recording
                stream += 1
            try:
                snapshot = read_snapshot(directory)
            except Exception:  # noqa: BLE001 - not written yet
                continue
            generation = (snapshot.get("server", {}).get("uptime_s"), len(snapshot["recordings"]))
            if generation in seen or snapshot.get("recordings_mismatch"):
                continue
            seen.add(generation)
            why = _disagreement(snapshot)
            if why is not None:
                bad.append(why)
        assert len(seen) >= 10, f"only {len(seen)} snapshots in 120 s"
    # main: the snapshot's part counted recordings made after the refresh part (adopted, not
    # yet read), which the recordings list did not show
    assert not bad, f"{len(bad)} of {len(seen)} snapshots disagreed, first: {bad[0]}"

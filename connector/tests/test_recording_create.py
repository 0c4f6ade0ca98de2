"""A recording made by ``RecordingStore.create`` (issue 31: a fresh directory is not recovered,
its stop and purge files not looked for): it records from its start, and so does one made where
a crash left its directory (between mkdir and its descriptor), which is recovered as before."""

from __future__ import annotations

import os
import time
from pathlib import Path

from aeron_spark.connector.server.framing import Framer
from aeron_spark.transport.archive import RecordingStore
from aeron_spark.transport.protocol.logbuffer import LogGeometry

TERM = 64 * 1024


def _record(store: RecordingStore, session_id: int, count: int) -> tuple[int, int]:
    rec = store.create(10, session_id, "session:test", 0, 0, 0, TERM, 1408, time.time_ns())
    assert rec.recorded_position == rec.d.start_position == 0
    assert rec.stop_position is None
    framer = Framer(LogGeometry(TERM, 1408, 0), session_id, 10, 0)
    for position, block in framer.frame([b"m" * 100] * count, None):
        rec.append(block, position, time.time_ns())
    rec.acknowledge(rec.recorded_position)
    return rec.d.recording_id, rec.recorded_position


def test_a_new_recording_records_from_its_start_and_is_recovered_whole(tmp_path: Path) -> None:
    store = RecordingStore(str(tmp_path), fsync=False)
    os.makedirs(os.path.join(store.root, "1"))  # a crash between mkdir and the descriptor
    fresh_id, fresh_end = _record(store, 1, 3)  # id 0: a directory made now
    leftover_id, leftover_end = _record(store, 2, 5)  # id 1: the leftover directory
    assert (fresh_id, leftover_id) == (0, 1)
    assert fresh_end == 3 * 160 and leftover_end == 5 * 160
    store.close(time.time_ns())
    again = RecordingStore(str(tmp_path), fsync=False)
    try:
        assert again.get(fresh_id).recorded_position == fresh_end
        assert again.get(leftover_id).recorded_position == leftover_end
    finally:
        again.close(time.time_ns())

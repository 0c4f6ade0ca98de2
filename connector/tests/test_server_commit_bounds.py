"""What the sink committer keeps is bounded (issue 31 item 6: every committed batch stayed in
``SinkCommitter.done``, ~450 bytes each, and in the commit log, forever), and a restart keeps
exactly-once: a repeated commit of a remembered batch, or of a streaming sink's older batch,
appends nothing; each sink recording keeps its visible end."""

from __future__ import annotations

import os
from pathlib import Path

from aeron_spark.connector.server import ServerConfig
from aeron_spark.connector.server.staging import PartKey, SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore

WINDOW = 4
COMPACT_BYTES = 4 * 1024


def _open(directory: Path) -> tuple[ArchiveStore, SinkCommitter]:
    config = ServerConfig(directory=str(directory), port=0, term_length=64 * 1024, mtu=1408)
    store = ArchiveStore(config, None)  # no ingest channel: no driver needed
    committer = SinkCommitter(
        str(directory / "sink"), store, done_window=WINDOW, compact_min_bytes=COMPACT_BYTES
    )
    committer.recover(0)
    return store, committer


def _commit(committer: SinkCommitter, sink: str, batch: int, stream: int) -> dict:
    key = PartKey(sink, batch, 0, 0)
    part = committer.staging.write("session", key, stream, [b"%d" % batch] * 3, None, True)
    return committer.commit(sink, batch, stream, [part], 0)


def _close(store: ArchiveStore, committer: SinkCommitter) -> None:
    committer.close()
    store.close()


def test_a_long_run_of_commits_keeps_a_bounded_window_and_log(tmp_path: Path) -> None:
    store, committer = _open(tmp_path)
    log_path = str(tmp_path / "sink" / "commit.log")
    sizes = []
    for batch in range(150):
        _commit(committer, "streaming", batch, 7)  # batch ids grow: a streaming query
        _commit(committer, "batch-write", (batch * 7919) % 1009, 8)  # ids in no order
        if batch == 10:
            _commit(committer, "other-stream", 0, 9)  # a recording written long ago
        assert len(committer.done) <= 3 * WINDOW
        sizes.append(os.path.getsize(log_path))
    assert committer.log.compactions > 0
    assert max(sizes) <= 2 * COMPACT_BYTES + 4096  # compacted whenever it doubled
    ends = dict(committer.visible)
    last = _commit(committer, "streaming", 149, 7)  # the last batch again: its result
    assert last["count"] == 3 and last["batch_id"] == 149
    _close(store, committer)

    store, committer = _open(tmp_path)  # a restart reads the compacted log
    try:
        assert committer.visible == ends  # every sink recording's visible end survived
        assert committer.last_committed_batch("streaming") == 149
        assert _commit(committer, "streaming", 149, 7) == last  # remembered: appends nothing
        # below the window of a sink whose ids only grew: committed long ago, appends nothing
        old = _commit(committer, "streaming", 3, 7)
        assert old == {"sink_id": "streaming", "batch_id": 3, "forgotten": True}
        assert committer.forgotten_commits == 1
        assert committer.visible == ends
        assert (
            _commit(committer, "streaming", 150, 7)["start_position"] == ends[last["recording_id"]]
        )
        assert len(committer.done) <= 3 * WINDOW
    finally:
        _close(store, committer)


def test_a_small_commit_reads_its_part_without_allocating_4_mib(tmp_path: Path) -> None:
    """A commit reads its parts back in blocks of at most 4 MiB; ``fh.read(4 MiB)`` allocates
    4 MiB before it reads, whatever the file holds, so every commit of the soak's sink (fifty
    100-byte rows every 0.2 s) allocated 4 MiB: the soak server's always-present 4 MiB block
    under tracemalloc (its traced peak 5.3 MB for 1.1 MB live). Now a read asks for what is
    left of the file (at most a block): a commit of fifty 100-byte rows peaks at a few KiB; a
    larger part is still read and framed whole, record for record."""
    import tracemalloc

    store, committer = _open(tmp_path)
    try:
        key = PartKey("soak", 0, 0, 0)
        part = committer.staging.write("session", key, 7, [b"s" * 100] * 50, None, True)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            done = committer.commit("soak", 0, 7, [part], 0)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        assert done["count"] == 50
        assert peak < 1024 * 1024, f"a commit of 50 x 100 bytes peaked at {peak / 2**20:.2f} MiB"
        # a part of longer records than the buffer holds: framed whole, record for record
        rows = [b"%06d" % i + b"L" * 994 for i in range(300)]
        key = PartKey("soak", 1, 0, 0)
        part = committer.staging.write("session", key, 7, rows, None, True)
        done = committer.commit("soak", 1, 7, [part], 0)
        assert done["count"] == 300
        cursor = store.open_replay(done["recording_id"], done["start_position"], None)
        got = bytearray()
        while (read := cursor.read(4 * 1024 * 1024, 0)) is not None:
            got += read[3]
            if len(got) >= 300 * 1056:
                break
        cursor.close()
        framed = [bytes(got[i * 1056 + 32 : i * 1056 + 32 + 1000]) for i in range(300)]
        assert framed == rows
    finally:
        _close(store, committer)

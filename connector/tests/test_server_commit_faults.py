"""Sink commits and the commit log on a file system that fills up (issue 15): a failed append
leaves no torn record in front of later ones, a failed commit leaves nothing of itself visible or
to be resumed after a restart, and its retry commits it once. A real tmpfs is mounted."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from aeron_spark.connector.server.commitlog import CommitLog
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.staging import PartKey, SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.transport.archive.testing import MountUnavailable, fill, small_tmpfs


@pytest.fixture
def tmpfs() -> Iterator[str]:
    try:
        with small_tmpfs(2 * 1024 * 1024) as path:
            yield path
    except MountUnavailable as exc:
        pytest.skip(str(exc))


def test_a_commit_log_append_that_does_not_fit_leaves_no_torn_record(tmpfs: str) -> None:
    path = os.path.join(tmpfs, "commit.log")
    log = CommitLog(path)
    log.append({"t": "done", "batch_id": 0, "sink_id": "s"})
    filler = fill(tmpfs, leave_bytes=40_000)
    with pytest.raises(OSError):
        log.append({"t": "begin", "batch_id": 1, "sink_id": "s", "pad": b"x" * 200_000})
    os.unlink(filler)
    log.append({"t": "done", "batch_id": 2, "sink_id": "s"})
    log.close()
    assert [r["batch_id"] for r in CommitLog(path).records] == [0, 2]


def test_a_failed_commit_is_cut_off_cancelled_and_committed_once_when_retried(
    tmpfs: str,
) -> None:
    config = ServerConfig(directory=tmpfs, port=0)
    store = ArchiveStore(config, driver=None)
    committer = SinkCommitter(os.path.join(tmpfs, "sink"), store)
    owner = object()
    payloads = [b"row-%06d" % i + b"." * 1000 for i in range(600)]  # 600 KB of frames
    staged = committer.staging.write(owner, PartKey("s", 0, 0, 0), 10, payloads, None, True)
    filler = fill(tmpfs, leave_bytes=300_000)  # the begin record fits, the frames do not
    with pytest.raises(OSError):
        committer.commit("s", 0, 10, [staged], 0)
    (rec,) = store.recordings.recordings.values()
    assert rec.recorded_position == rec.d.start_position  # the frames written were cut off
    assert store.visible_end(rec) == rec.d.start_position
    assert committer.last_committed_batch("s") is None
    os.unlink(filler)
    committer.close()
    store.close()

    # a restart does not resume the failed commit (it was cancelled)...
    store = ArchiveStore(config, driver=None)
    committer = SinkCommitter(os.path.join(tmpfs, "sink"), store)
    assert committer.recover(0) == 0
    assert committer.last_committed_batch("s") is None
    # ... and the client's retry commits it, once, from the recording's start
    result = committer.commit("s", 0, 10, [staged], 0)
    (rec,) = store.recordings.recordings.values()
    assert result["start_position"] == rec.d.start_position
    assert result["count"] == len(payloads)
    assert store.visible_end(rec) == result["end_position"] == rec.recorded_position
    assert committer.commit("s", 0, 10, [staged], 0) == result  # a duplicate appends nothing
    committer.close()
    store.close()

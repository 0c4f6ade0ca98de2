"""Sink commits and the commit log on a file system that fills up (issue 15): a failed append
leaves no torn record in front of later ones, a failed commit leaves nothing of itself visible or
to be resumed after a restart, and its retry commits it once. A real tmpfs is mounted."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from aeron_spark.connector.server.commitlog import CommitLog
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import ServerCore
from aeron_spark.connector.server.staging import PartKey, SinkCommitter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import protocol as proto
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


def test_a_publish_failing_in_its_second_block_takes_back_its_first_and_the_next_one_fits(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArchiveStore(ServerConfig(directory=str(tmp_path), port=0), driver=None)
    publisher = store.open_publisher(10, "session:test", 0)
    start = publisher.publish([b"first"], None, 0)
    real_pwrite = os.pwrite
    calls = []

    def second_block_fails(fd: int, data: bytes, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    big = [b"%07d" % i + b"." * 993 for i in range(5000)]  # 5 MB: two framer blocks
    monkeypatch.setattr(os, "pwrite", second_block_fails)
    with pytest.raises(OSError):
        publisher.publish(big, None, 0)
    monkeypatch.undo()
    rec = publisher.rec
    assert rec.recorded_position == start  # the first block was taken back
    assert os.path.getsize(rec._segment_path(0)) == start
    # the session goes on at the same position (the framer did not run ahead)
    end = publisher.publish([b"next"], None, 0)
    cursor = store.open_replay(rec.d.recording_id, rec.d.start_position, end)
    got = []
    while (chunk := cursor.read(1 << 20, 0)) is not None:
        got.append(bytes(chunk[3]))
    frames = b"".join(got)
    assert b"first" in frames and b"next" in frames and b"0000000" not in frames
    store.close()


@pytest.mark.parametrize(
    ("err", "code", "reason"),
    [
        (errno.EIO, 14, "EIO"),
        (errno.ENOSPC, 14, "ENOSPC"),
        (errno.EMFILE, 15, None),
    ],
)
def test_an_io_error_fails_only_that_request_coded_and_the_session_goes_on(
    tmp_path, monkeypatch: pytest.MonkeyPatch, err: int, code: int, reason: str | None
) -> None:
    config = ServerConfig(directory=str(tmp_path), port=0)
    store = ArchiveStore(config, driver=None)
    core = ServerCore(config, store, SinkCommitter(os.path.join(str(tmp_path), "sink"), store))
    core.open_session("a", "peer-a", 1 << 20, now_ns=0)

    def request(rid: int, op: str, args: dict) -> proto.Reply:
        (reply,) = core.on_message("a", proto.encode_request(rid, op, args), rid, rid)
        return proto.decode_reply(reply)

    assert request(1, "publish", {"stream_id": 5, "payloads": [b"a" * 100] * 10}).ok
    real_pwrite = os.pwrite

    def failing(fd: int, data: bytes, offset: int) -> int:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "pwrite", failing)
    failed = request(2, "publish", {"stream_id": 5, "payloads": [b"b" * 100] * 10})
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert not failed.ok and failed.error["code"] == code
    if reason is not None:
        assert failed.error["details"]["reason"] == reason
        assert failed.error["details"]["directory"] == os.path.abspath(str(tmp_path))
    else:
        assert failed.error["details"]["soft_limit"] != 0
    end = request(3, "publish", {"stream_id": 5, "payloads": [b"c" * 100] * 10}).result
    assert end == 2 * 10 * 160  # the failed publish left no trace: 20 frames of 160 bytes
    counters = request(4, "stats", {}).result["counters"]
    assert counters["internal_errors"] == 0
    assert counters["storage_full_errors" if code == 14 else "too_many_open_files_errors"] == 1
    store.close()

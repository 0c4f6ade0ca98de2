"""The commit log's compaction keeps appends on the file that is the log (the attacker's
review of this session): after the rename, anything that fails (the directory's fsync, a
descriptor that cannot be opened) must not leave the log writing to the old, unlinked file,
whose records the next start would never read."""

from __future__ import annotations

import errno
import os

import pytest

from aeron_spark.connector.server import commitlog
from aeron_spark.connector.server.commitlog import CommitLog


def test_an_append_after_a_compaction_whose_directory_fsync_failed_is_in_the_log(
    tmp_path, monkeypatch
) -> None:
    path = str(tmp_path / "commit.log")
    log = CommitLog(path)
    for n in range(10):
        log.append({"n": n})

    def no_descriptors(directory: str) -> None:
        raise OSError(errno.EMFILE, "Too many open files", directory)

    monkeypatch.setattr(commitlog, "fsync_dir", no_descriptors)
    with pytest.raises(OSError):
        log.compact(lambda record: record if record["n"] >= 5 else None)
    monkeypatch.undo()
    log.append({"n": 10})  # acknowledged to its client: it must survive a restart
    log.close()

    reopened = CommitLog(path)
    try:
        assert [r["n"] for r in reopened.records] == [5, 6, 7, 8, 9, 10]
    finally:
        reopened.close()


def test_an_append_after_a_compaction_that_could_not_reopen_the_log_is_in_the_log(
    tmp_path, monkeypatch
) -> None:
    path = str(tmp_path / "commit.log")
    log = CommitLog(path)
    for n in range(4):
        log.append({"n": n})
    real_open = commitlog.os.open

    def open_without_descriptors(name, flags, *args):  # only the log itself, after the rename
        if name == path:
            raise OSError(errno.EMFILE, "Too many open files", name)
        return real_open(name, flags, *args)

    monkeypatch.setattr(commitlog.os, "open", open_without_descriptors)
    try:
        log.compact(lambda record: record)
    except OSError:
        pass  # a compaction may fail; what it must not do is lose a later append
    finally:
        monkeypatch.undo()
    log.append({"n": 4})
    log.close()
    reopened = CommitLog(path)
    try:
        assert [r["n"] for r in reopened.records] == [0, 1, 2, 3, 4]
    finally:
        reopened.close()


def test_compaction_memory_is_bounded_by_a_chunk_not_by_the_log(tmp_path) -> None:
    """Issue 31 item 6: the first compaction of a ~1 MiB log read and decoded it whole, and the
    allocator's high-water mark stayed (+5.3 MB of the soak server's RSS for good). Record by
    record, its peak is a chunk's, whatever the log's size (4 MiB here, every record kept)."""
    import tracemalloc

    path = str(tmp_path / "commit.log")
    pad = "x" * 150
    count = 0
    with open(path, "wb") as fh:  # written directly: 20,000 fsynced appends would take minutes
        while fh.tell() < 4 * 1024 * 1024:
            fh.write(
                commitlog._encode({"t": "done", "sink_id": "s", "batch_id": count, "pad": pad})
            )
            count += 1
    log_size = os.path.getsize(path)
    log = CommitLog(path)
    try:
        assert len(log.records) == count
        log.records = []  # taken, as the committer does
        tracemalloc.start()
        try:
            size = log.compact(lambda record: record if record["batch_id"] % 2 == 0 else None)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1024 * 1024, f"compacting a {log_size}-byte log peaked at {peak} bytes"
        assert size == os.path.getsize(path)
        log.append({"t": "done", "sink_id": "s", "batch_id": count, "pad": ""})
    finally:
        log.close()
    reopened = CommitLog(path)
    try:
        assert [r["batch_id"] for r in reopened.records] == [*range(0, count, 2), count]
        assert reopened.torn_bytes_truncated == 0
    finally:
        reopened.close()
    assert sorted(os.listdir(tmp_path)) == ["commit.log"]  # no temporary file left

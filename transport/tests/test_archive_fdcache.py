"""The recording files' descriptor cache: least recently used out, a stopped recording's files
closed without a walk of the whole cache (issue 31: both walked every cached file)."""

from __future__ import annotations

import os
from pathlib import Path

from aeron_spark.transport.archive.fdcache import FdCache


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_eviction_takes_the_least_recently_used_unpinned_file(tmp_path: Path) -> None:
    cache = FdCache(3)
    paths = [str(tmp_path / f"f{i}") for i in range(5)]
    with cache.use(paths[0], True, create=True):  # pinned while a 4th and 5th come
        for path in paths[1:]:
            with cache.use(path, True, create=True):
                pass
        assert len(cache) == 3 and cache.evictions == 2
        stats = cache.stats()
    assert stats["file_opens"] == 5
    # f0 (pinned) stayed; f1 and f2 (the oldest unpinned) went
    with cache.use(paths[0], True):
        pass
    assert cache.stats()["file_opens"] == 5
    cache.close()


def test_forget_under_closes_exactly_that_directorys_files(tmp_path: Path) -> None:
    cache = FdCache(100)
    before = _open_fds()
    for d in range(10):
        directory = tmp_path / str(d)
        directory.mkdir()
        for name in ("0.seg", "index"):
            with cache.use(str(directory / name), True, create=True):
                pass
    assert _open_fds() - before == 20
    assert cache.forget_under(str(tmp_path / "3")) == 2
    assert cache.forget_under(str(tmp_path / "3") + "/") == 0  # already closed
    assert len(cache) == 18 and _open_fds() - before == 18
    cache.close()
    assert _open_fds() == before
